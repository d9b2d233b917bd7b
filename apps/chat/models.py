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

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    role = models.CharField(max_length=10, choices=Role.choices)
    text = models.TextField()
    created = models.DateTimeField(auto_now_add=True)
    # The generation that produced (assistant) or triggered (user) this message. Unique, so a
    # request delivered twice can never store two answers.
    request_id = models.CharField(max_length=64, unique=True, null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["created", "id"]
        indexes = [models.Index(fields=["conversation", "created"])]

    def __str__(self) -> str:
        return f"{self.role}: {self.text[:40]}"
