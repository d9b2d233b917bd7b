from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone


class User(AbstractUser):
    """Sluice's user; custom from the first migration so fields can be added later."""

    class Meta:
        db_table = "accounts_user"


class Tag(models.Model):
    """A trait an admin defines (e.g. "teacher", "prefers-short-answers"); users pick theirs.

    `prompt_hint` is the sentence the tag adds to the system prompt.
    """

    name = models.CharField(max_length=50, unique=True)
    slug = models.SlugField(max_length=50, unique=True)
    prompt_hint = models.CharField(max_length=300, blank=True)
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Profile(models.Model):
    class Expertise(models.TextChoices):
        BEGINNER = "beginner", "Beginner"
        INTERMEDIATE = "intermediate", "Intermediate"
        EXPERT = "expert", "Expert"

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="profile"
    )
    display_name = models.CharField(max_length=80, blank=True)
    language = models.CharField(max_length=35, default="English")
    expertise = models.CharField(
        max_length=20, choices=Expertise.choices, default=Expertise.INTERMEDIATE
    )
    about = models.TextField("about me", max_length=500, blank=True)
    tags = models.ManyToManyField(Tag, blank=True, related_name="profiles")
    updated = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.display_name or self.user.get_username()


class ApiKey(models.Model):
    """A key for API clients. Only a SHA-256 of the key is stored; the key is shown once."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=80)
    prefix = models.CharField(
        max_length=16, help_text="The key's first characters, to tell keys apart."
    )
    key_hash = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class TagProposal(models.Model):
    """A tag Sluice suggests from what the user asks; applied to the profile only when the user
    says yes."""

    class Status(models.TextChoices):
        PROPOSED = "proposed", "Proposed"
        ACCEPTED = "accepted", "Accepted"
        REJECTED = "rejected", "Rejected"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tag_proposals"
    )
    tag = models.ForeignKey(Tag, on_delete=models.CASCADE, related_name="proposals")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PROPOSED)
    created = models.DateTimeField(auto_now_add=True)
    decided = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]
        # One proposal per user and tag: a rejected tag is not proposed again.
        constraints = [models.UniqueConstraint(fields=["user", "tag"], name="one_proposal_per_tag")]

    def __str__(self) -> str:
        return f"{self.tag} for {self.user} ({self.status})"


class StaffReadQuerySet(models.QuerySet):
    """Bulk writes would bypass the model's refusals below; they are refused here too."""

    def update(self, **kwargs):
        raise PermissionError("The staff read log is append-only.")

    def delete(self):
        raise PermissionError("The staff read log is append-only.")


class StaffRead(models.Model):
    """One read by staff of what another person wrote (a conversation, a message, a vote's
    comment, a request's text), with the reason the reader gave. Append-only: the model refuses
    changes and deletion, and a trigger (migration 0004) refuses them in the database.

    The people are kept by id and by name, without foreign key constraints: the record outlives
    both accounts (deleting a person must not delete, nor be blocked by, what was read of them).
    """

    reader = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    reader_name = models.CharField(max_length=150)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    owner_name = models.CharField(max_length=150)
    # What was read: "conversation", "message", "request", "feedback comment"; and which one.
    subject = models.CharField(max_length=40)
    subject_id = models.CharField(max_length=64)
    reason = models.TextField(max_length=500)
    address = models.GenericIPAddressField(null=True, blank=True)
    at = models.DateTimeField(auto_now_add=True)

    objects = StaffReadQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["owner", "-at"], name="staff_read_by_owner")]

    def __str__(self) -> str:
        return f"{self.reader_name} read {self.owner_name}'s {self.subject} {self.subject_id}"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise PermissionError("The staff read log is append-only.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise PermissionError("The staff read log is append-only.")


class Suspension(models.Model):
    """Staff stopped a person using Sluice, for a reason, until a time (or until lifted). While
    it stands the account is inactive: sockets, event streams and API keys stop as for any
    deactivation (apps/accounts/signals.py), and sign-in says why (apps/accounts/forms.py)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="suspensions"
    )
    reason = models.TextField(
        max_length=500, help_text="Shown to the person when they try to sign in."
    )
    until = models.DateTimeField(
        null=True, blank=True, help_text="Empty: until a member of staff lifts it."
    )
    by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created = models.DateTimeField(auto_now_add=True)
    lifted = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"Suspension of {self.user}"

    def clean(self) -> None:
        if self._state.adding and self.until and self.until <= timezone.now():
            raise ValidationError({"until": "A time still to come (or empty: until lifted)."})


class MailboxMessage(models.Model):
    """A mail Sluice would have sent, kept for the dev mailbox page while no mail server is
    configured (apps/accounts/mailbox.py). Only the newest DEV_MAILBOX_KEEP are kept."""

    to = models.TextField()
    subject = models.CharField(max_length=300)
    body = models.TextField()
    sent = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-sent", "-id"]

    def __str__(self) -> str:
        return f"{self.subject} to {self.to}"
