"""Messages Sluice starts itself, for one user (answer ready, follow-ups) or for many (an admin's
announcement): kept until read, shown live in every open tab."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Announcement(models.Model):
    """A message an admin sends to every user's inbox, or to the users of one plan. Sent once,
    when it is first saved; each recipient gets its own inbox message."""

    text = models.TextField(max_length=1000)
    plan = models.ForeignKey(
        "admission.Plan",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        help_text="Only this plan's users; empty: everyone.",
    )
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created = models.DateTimeField(auto_now_add=True)
    recipients = models.PositiveIntegerField(default=0, editable=False)

    class Meta:
        db_table = "chat_announcement"  # made by the chat app, whose part this was
        ordering = ["-created"]

    def __str__(self) -> str:
        return self.text[:60]


class InboxMessage(models.Model):
    """A message Sluice starts itself, for one user: shown live in every open tab, or kept
    (unread) for the next visit."""

    class Kind(models.TextChoices):
        ANSWER_READY = "answer_ready", "Answer ready"
        ANNOUNCEMENT = "announcement", "Announcement"
        FOLLOWUPS = "followups", "Follow-up questions"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="inbox"
    )
    kind = models.CharField(max_length=20, choices=Kind.choices)
    text = models.TextField(max_length=2000, blank=True)
    data = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "chat_inboxmessage"
        ordering = ["id"]
        indexes = [
            models.Index(
                fields=["user", "id"],
                name="chat_inbox_unread",
                condition=models.Q(read_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} for {self.user_id}"
