"""What leaves the database, and when.

Erase: deleting a conversation means gone: its rows in PostgreSQL (messages, summary, the inbox
messages about it), and in Redis the answer it may be generating (stopped) and every stored
answer's state and event stream, which would hold its text until their TTLs.

Retention: the admin's retention policy (RetentionPolicy): conversations untouched for N days are
archived, and archived ones untouched for M days lose their cold detail, all but their latest
turns (the rolling summary, which speaks for older turns in prompts, stays). Applied by
`manage.py apply_retention`, which a scheduler runs daily.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone
from redis.exceptions import RedisError

from apps.chat.models import Conversation, Message, RetentionPolicy
from apps.inbox import services as inbox
from apps.usage import services as usage
from contract import transitions
from core.commits import after_commit
from core.redis_client import get_redis, keys

log = logging.getLogger("sluice.chat.erase")

# -- erase ------------------------------------------------------------------------------------


@transaction.atomic
def conversation_erase(*, conversation: Conversation) -> None:
    conversation_id = conversation.pk
    request_ids = [r for r in conversation.messages.values_list("request_id", flat=True) if r]
    inbox.inbox_forget_conversation(user_id=conversation.owner_id, conversation_id=conversation_id)
    # Votes and comments on its answers are the person's words about it: they go with it.
    usage.feedback_erase(conversation_ids=[conversation_id])
    # Its messages in one statement, then the conversation.
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


# -- retention --------------------------------------------------------------------------------
@dataclass
class RetentionResult:
    archived: int = 0
    trimmed_conversations: int = 0
    deleted_messages: int = 0


def retention_apply(
    *, policy: RetentionPolicy | None = None, now: datetime | None = None
) -> RetentionResult:
    policy = policy or RetentionPolicy.current()
    now = now or timezone.now()
    result = RetentionResult()
    if policy.archive_after_days:
        cutoff = now - timedelta(days=policy.archive_after_days)
        # update(), not save(): archiving must not count as touching the conversation.
        result.archived = Conversation.objects.filter(archived=False, updated__lt=cutoff).update(
            archived=True
        )
    if policy.drop_detail_after_days:
        cutoff = now - timedelta(days=policy.drop_detail_after_days)
        trimmed = _drop_detail(cutoff=cutoff, keep=policy.keep_turns)
        result.trimmed_conversations = len(trimmed)
        result.deleted_messages = sum(trimmed.values())
    return result


@transaction.atomic
def _drop_detail(*, cutoff: datetime, keep: int) -> dict[int, int]:
    """Deletes all but the latest `keep` messages of archived conversations untouched since
    `cutoff`; returns {conversation id: messages deleted}."""
    messages, conversations = Message._meta.db_table, Conversation._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            DELETE FROM {messages} m USING (
                SELECT id FROM (
                    SELECT m.id, row_number() OVER (PARTITION BY m.conversation_id
                                                    ORDER BY m.created DESC, m.id DESC) AS n
                    FROM {messages} m JOIN {conversations} c ON c.id = m.conversation_id
                    WHERE c.archived AND c.updated < %s
                ) ranked WHERE n > %s
            ) cold
            WHERE m.id = cold.id
            RETURNING m.conversation_id
        """,
            [cutoff, keep],
        )
        counts: dict[int, int] = {}
        for (conversation_id,) in cursor.fetchall():
            counts[conversation_id] = counts.get(conversation_id, 0) + 1
    return counts
