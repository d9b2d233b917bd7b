from __future__ import annotations

from django.conf import settings
from django.db import models


class Conversation(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations"
    )
    title = models.CharField(max_length=120, default="New chat")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)
    archived = models.BooleanField(default=False)
    # The model its answers come from, as workers announce it ("": the default model).
    model = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["-updated"]
        indexes = [models.Index(fields=["owner", "archived", "-updated"])]

    def __str__(self) -> str:
        return self.title


class Message(models.Model):
    class Role(models.TextChoices):
        SYSTEM = "system", "System"
        USER = "user", "User"
        ASSISTANT = "assistant", "Assistant"

    class Status(models.TextChoices):
        DONE = "done", "Done"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Stopped"

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    role = models.CharField(max_length=10, choices=Role.choices)
    text = models.TextField()
    created = models.DateTimeField(auto_now_add=True)
    # The generation that produced this (assistant) message. Unique, so a request delivered
    # twice can never store two answers.
    request_id = models.CharField(max_length=64, unique=True, null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    # An answer that failed or was stopped is kept (with what text there was) so the user sees
    # what happened; only done turns go back into later prompts.
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.DONE)
    error = models.CharField(max_length=300, blank=True)
    # Passages the answer cites: [{number, chunk_id, document_id, title, snippet, source_url}].
    citations = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["created", "id"]
        indexes = [models.Index(fields=["conversation", "created"])]

    def __str__(self) -> str:
        return f"{self.role}: {self.text[:40]}"
