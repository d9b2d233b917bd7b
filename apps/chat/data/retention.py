"""The admin's retention policy (RetentionPolicy): conversations untouched for N days are
archived, and archived ones untouched for M days lose their cold detail, all but their latest
turns (the rolling summary, which speaks for older turns in prompts, stays). Applied by
`manage.py apply_retention`, which a scheduler runs daily."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from apps.chat.models import Conversation, Message, RetentionPolicy
from apps.chat.prompt import hot
from core.commits import after_commit


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
    # Raw SQL sends no signals: the hot tier is told here.
    after_commit(lambda: hot.conversations_forget(counts))
    return counts
