from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.db import models

from core.querysets import NotifyingManager


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

    objects = NotifyingManager()  # bulk writes reach the caches (querysets.py)

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

    objects = NotifyingManager()  # bulk writes reach the caches (querysets.py)

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
