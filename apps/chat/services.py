"""Writes for chat: conversations and their messages."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache

from django.conf import settings
from django.core.exceptions import ValidationError

from apps.accounts.models import User
from apps.accounts.sessions import SqlCondition
from apps.chat.data import retention
from apps.chat.models import Conversation, Message
from apps.chat.selectors import RequestInfo, request_get_for_user
from contract import protocol, transitions
from core.prepared import prepared_cursor
from core.redis_client import get_redis, keys


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


UNTITLED = "New chat"  # a conversation's title until its first question names it


def conversation_create(*, owner: User, title: str = UNTITLED) -> Conversation:
    return Conversation.objects.create(owner=owner, title=clean_title(title))


def conversation_rename(*, conversation: Conversation, title: str) -> Conversation:
    conversation.title = clean_title(title)
    conversation.save(update_fields=["title", "updated"])
    return conversation


def conversation_set_archived(*, conversation: Conversation, archived: bool) -> Conversation:
    conversation.archived = archived
    conversation.save(update_fields=["archived", "updated"])
    return conversation


def conversation_set_model(*, conversation: Conversation, model: str) -> Conversation:
    """Remembers the model the conversation's answers come from ("": the default one). The
    caller checks that the user may use it."""
    conversation.model = (model or "").strip()[: Conversation._meta.get_field("model").max_length]
    conversation.save(update_fields=["model"])
    return conversation


def conversation_delete(*, conversation: Conversation) -> None:
    """Gone from PostgreSQL and Redis (see data/retention.py)."""
    retention.conversation_erase(conversation=conversation)


def _insert_sql(only_if: str = "") -> str:
    """One message's INSERT, stored only while its conversation exists and `only_if` (SQL)
    holds too, when given."""
    return f"""
        INSERT INTO {Message._meta.db_table} (conversation_id, role, text, created, request_id,
            prompt_tokens, completion_tokens, status, error, citations, finish_reason)
        SELECT %(conversation)s, %(role)s, %(text)s, now(), %(request_id)s,
            %(prompt_tokens)s, %(completion_tokens)s, %(status)s, %(error)s,
            %(citations)s::jsonb, %(finish_reason)s
        WHERE EXISTS (SELECT 1 FROM {Conversation._meta.db_table} WHERE id = %(conversation)s)
            {f"AND {only_if}" if only_if else ""}
        ON CONFLICT (request_id) DO NOTHING
        RETURNING id, created
    """


def _touch_sql() -> str:
    """After an insert named `new`: a question touches its conversation (the sidebar's order,
    the title); its answer, a second later, does not rewrite the row again."""
    return f"""
        UPDATE {Conversation._meta.db_table}
        SET updated = now(),
            title = CASE WHEN title = %(untitled)s AND %(title)s::text <> ''
                         THEN %(title)s ELSE title END
        WHERE id = %(conversation)s AND %(role)s = 'user' AND EXISTS (SELECT 1 FROM new)
        RETURNING title
    """


@cache
def _message_insert_sql(only_if: str = "") -> str:
    """The insert, stored only while `only_if` (SQL) holds too, when given."""
    return f"""
        WITH new AS ({_insert_sql(only_if=only_if)}), touched AS ({_touch_sql()})
        SELECT new.id, new.created, (SELECT title FROM touched) FROM new
    """


@dataclass
class NewMessage:
    """A message as it is stored: the fields `message_create` writes."""

    conversation: Conversation
    role: str
    text: str
    request_id: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    status: str = Message.Status.DONE
    error: str = ""
    citations: list = field(default_factory=list)
    finish_reason: str = ""

    def params(self) -> dict:
        title = clean_title(self.text)[:60] if self.role == Message.Role.USER else ""
        return {
            "conversation": self.conversation.pk,
            "role": self.role,
            "text": self.text,
            "request_id": self.request_id,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "status": self.status,
            "error": self.error,
            "citations": json.dumps(self.citations),
            "finish_reason": self.finish_reason,
            "untitled": UNTITLED,
            "title": title,
        }


def message_create(
    *,
    conversation: Conversation,
    role: str,
    text: str,
    request_id: str | None = None,
    prompt_tokens: int | None = None,
    completion_tokens: int | None = None,
    status: str = Message.Status.DONE,
    error: str = "",
    citations: list | None = None,
    only_if: SqlCondition | None = None,
) -> Message | None:
    """Stores a message and touches its conversation (a new chat takes its title from its
    first question). None when a message with this request id exists already (an answer is
    stored once, however often its completion is delivered), the conversation is gone, or
    `only_if` (a condition the insert checks in the same statement, such as the sender's login
    session: SessionCheck.condition) does not hold."""
    if role == Message.Role.USER:
        text = clean_message_text(text)
    return message_store(
        NewMessage(
            conversation=conversation,
            role=role,
            text=text,
            request_id=request_id,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            status=status,
            error=error,
            citations=citations or [],
        ),
        only_if=only_if,
    )


def message_store(new: NewMessage, *, only_if: SqlCondition | None = None) -> Message | None:
    """`message_create` without the text's validation: one SQL statement, as every question
    and every answer passes here (no transaction, no savepoint, no IntegrityError round trip,
    no ORM query building)."""
    params = new.params()
    if only_if is not None:
        params.update(only_if.params)
    with prepared_cursor() as cursor:
        cursor.execute(_message_insert_sql(only_if.sql if only_if else ""), params)
        row = cursor.fetchone()
    if row is None:
        return None
    message_id, created, new_title = row
    return _stored(new, message_id, created, new_title)


def _stored(new: NewMessage, message_id: int, created, new_title: str | None) -> Message:
    """The Message that `new` became: its id and creation time from the insert's RETURNING."""
    if new_title is not None:
        new.conversation.title = new_title
    return Message(
        id=message_id,
        conversation=new.conversation,
        role=new.role,
        text=new.text,
        created=created,
        request_id=new.request_id,
        prompt_tokens=new.prompt_tokens,
        completion_tokens=new.completion_tokens,
        status=new.status,
        error=new.error,
        citations=new.citations,
    )


def messages_store(messages: list[NewMessage]) -> None:
    """Several messages in one round trip (psycopg pipelines executemany): the recorder's
    batches of answers. One stored before, or whose conversation is gone, is skipped."""
    if not messages:
        return
    with prepared_cursor() as raw:
        raw.executemany(_message_insert_sql(), [new.params() for new in messages])


def request_cancel(*, user: User, request_id: str) -> RequestInfo:
    """Stops the request: a worker checks the flag between batches and frees its slot; the
    dispatcher ends it at once if it is still waiting in line."""
    info = request_get_for_user(user=user, request_id=request_id)
    if info.state not in protocol.TERMINAL_STATES:
        pipe = get_redis().pipeline(transaction=False)
        transitions.stopped(pipe, keys(), request_id)
        pipe.execute()
    return info
