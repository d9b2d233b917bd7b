"""Writes for chat: conversations and their messages."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from apps.accounts.models import User

from .models import Conversation, Message


def clean_message_text(text: str) -> str:
    """The text as it will be stored, or a ValidationError a person can act on."""
    text = (text or "").strip()
    if not text:
        raise ValidationError("Type a message first.", code="empty")
    limit = settings.CHAT_MESSAGE_MAX_CHARS
    if len(text) > limit:
        raise ValidationError(
            f"That message is {len(text):,} characters; the limit is {limit:,}.",
            code="too_long",
        )
    return text


def clean_title(title: str) -> str:
    title = " ".join((title or "").split())
    if not title:
        raise ValidationError("A title cannot be empty.", code="empty")
    return title[: settings.CHAT_TITLE_MAX_CHARS]


def conversation_create(*, owner: User, title: str = "New chat") -> Conversation:
    return Conversation.objects.create(owner=owner, title=clean_title(title))


def conversation_rename(*, conversation: Conversation, title: str) -> Conversation:
    conversation.title = clean_title(title)
    conversation.save(update_fields=["title", "updated"])
    return conversation


def conversation_set_archived(*, conversation: Conversation, archived: bool) -> Conversation:
    conversation.archived = archived
    conversation.save(update_fields=["archived", "updated"])
    return conversation


def conversation_delete(*, conversation: Conversation) -> None:
    conversation.delete()


@transaction.atomic
def message_create(
    *,
    conversation: Conversation,
    role: str,
    text: str,
    request_id: str | None = None,
    prompt_tokens: int | None = None,
    completion_tokens: int | None = None,
) -> Message:
    if role == Message.Role.USER:
        text = clean_message_text(text)
    message = Message.objects.create(
        conversation=conversation,
        role=role,
        text=text,
        request_id=request_id,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
    )
    fields = ["updated"]
    # A new chat takes its title from its first question.
    if role == Message.Role.USER and conversation.title == "New chat":
        conversation.title = clean_title(text)[:60]
        fields.append("title")
    conversation.save(update_fields=fields)
    return message
