"""Reads for chat. Every lookup by id goes through a *_for_user helper, which 404s for ids
the user does not own."""

from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from apps.accounts.models import User

from .models import Conversation, Message


def conversation_list_for_user(*, user: User, archived: bool = False) -> QuerySet[Conversation]:
    return Conversation.objects.filter(owner=user, archived=archived)


def conversation_get_for_user(*, user: User, id: int) -> Conversation:
    return get_object_or_404(Conversation, owner=user, id=id)


def message_list_for_conversation(*, conversation: Conversation) -> QuerySet[Message]:
    return conversation.messages.all()
