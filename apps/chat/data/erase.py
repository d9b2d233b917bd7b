"""Deleting a conversation means gone: its rows in PostgreSQL (messages, summary, the inbox
messages about it), and in Redis its hot-tier keys, the answer it may be generating (stopped),
and every stored answer's state and event stream, which would hold its text until their TTLs."""

from __future__ import annotations

import logging

from django.db import connection, transaction
from redis.exceptions import RedisError

from apps.chat.models import Conversation, Message
from apps.chat.prompt import hot
from apps.inbox import services as inbox
from apps.usage import services as usage
from core.commits import after_commit
from core.redis_client import get_redis, keys
from worker import transitions

log = logging.getLogger("sluice.chat.erase")


@transaction.atomic
def conversation_erase(*, conversation: Conversation) -> None:
    conversation_id = conversation.pk
    request_ids = [r for r in conversation.messages.values_list("request_id", flat=True) if r]
    inbox.inbox_forget_conversation(user_id=conversation.owner_id, conversation_id=conversation_id)
    # Votes and comments on its answers are the person's words about it: they go with it.
    usage.feedback_erase(conversation_ids=[conversation_id])
    # Its messages in one statement: through the ORM, each would be loaded to send its delete
    # signal (the hot tier's), and the whole conversation is dropped from the hot tier below.
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {Message._meta.db_table} WHERE conversation_id = %s", [conversation_id]
        )
    conversation.delete()
    after_commit(lambda: _redis_erase(conversation_id, request_ids))


def _redis_erase(conversation_id: int, request_ids: list[str]) -> None:
    k = keys()
    client = get_redis()
    try:
        active = client.get(k.conversation_active(conversation_id))
        pipe = client.pipeline(transaction=False)
        if active:
            # Its worker frees the slot and nothing is stored; its own keys (the dispatcher
            # still settles it from them) end with their short TTLs.
            transitions.stopped(pipe, k, active)
        transitions.conversation_erased(pipe, k, conversation_id=conversation_id)
        for request_id in request_ids:
            transitions.request_erased(pipe, k, request_id)
        pipe.execute()
    except RedisError as exc:
        log.error(
            "conversation %s: Redis keys not erased (%s); they expire with their TTLs",
            conversation_id,
            exc,
        )
    hot.conversations_drop([conversation_id])
