"""What people report to staff: an answer they were given, with its question, copied when
reported (the conversation may change or be deleted after). The reporter's own words, shown
to staff only as the rest of their conversations are: with the permission to read others'
conversations, a reason, and a record (apps/ops/admin.py)."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Report(models.Model):
    class Category(models.TextChoices):
        HARMFUL = "harmful", "Harmful or dangerous"
        ABUSIVE = "abusive", "Hateful, harassing or sexual"
        PRIVATE = "private", "Someone's private information"
        WRONG = "wrong", "False or misleading"
        OTHER = "other", "Something else"

    class Status(models.TextChoices):
        OPEN = "open", "Open"
        ACTIONED = "actioned", "Action taken"
        DISMISSED = "dismissed", "Dismissed"

    reporter = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    subject = models.CharField(max_length=20, default="answer")
    conversation_id = models.BigIntegerField()
    message_id = models.BigIntegerField()
    request_id = models.CharField(max_length=64, blank=True)
    model = models.CharField(max_length=200, blank=True)
    reported_text = models.TextField()
    context = models.TextField(blank=True, help_text="The question the answer was given to.")
    category = models.CharField(max_length=16, choices=Category.choices)
    details = models.TextField(max_length=1000, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)
    created = models.DateTimeField(auto_now_add=True)
    handled = models.DateTimeField(null=True, blank=True)
    handled_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [models.Index(fields=["status", "-created"], name="report_queue")]
        # One report per person and answer: reporting again updates nothing and adds nothing.
        constraints = [
            models.UniqueConstraint(fields=["reporter", "message_id"], name="one_report_each")
        ]

    def __str__(self) -> str:
        return f"Report {self.pk} ({self.get_category_display()})"
