"""Reads for chat. Every lookup by id goes through a *_for_user helper, which 404s for ids
the user does not own."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache

import psycopg
from django.db import connection
from django.db.models import QuerySet
from django.http import Http404
from django.shortcuts import get_object_or_404

from apps.accounts.models import Profile, Tag, User
from apps.chat.models import Conversation, ConversationSummary, Message
from core.redis_client import get_redis, keys


def conversation_list_for_user(*, user: User, archived: bool = False) -> QuerySet[Conversation]:
    return Conversation.objects.filter(owner=user, archived=archived)


def conversation_get_for_user(*, user: User, id: int) -> Conversation:
    return get_object_or_404(Conversation, owner=user, id=id)


def message_list_for_conversation(*, conversation: Conversation) -> QuerySet[Message]:
    return conversation.messages.all()


# The reads behind every prompt run on each message sent, so they are plain SQL (the ORM
# spends more CPU compiling these small queries than PostgreSQL spends answering them) sent
# together in one round trip, each prepared on its connection (core/prepared.py says why).


@cache
def _history_sql() -> str:
    return f"""
        SELECT id, role, text, pinned FROM {Message._meta.db_table}
        WHERE conversation_id = %s AND role IN (%s, %s) AND status = %s
        ORDER BY created DESC, id DESC LIMIT %s
    """


@cache
def _memory_sql() -> str:
    """The conversation's summary (if any) and its pinned turns, newest first: one row per
    pinned turn, or one row of NULLs when none is pinned."""
    return f"""
        SELECT s.text, s.upto_message_id, s.facts, m.id, m.role, m.text
        FROM (SELECT 1) one
        LEFT JOIN {ConversationSummary._meta.db_table} s ON s.conversation_id = %(c)s
        LEFT JOIN {Message._meta.db_table} m ON m.conversation_id = %(c)s AND m.pinned
             AND m.status = %(done)s
        ORDER BY m.created DESC, m.id DESC LIMIT %(pins)s
    """


@dataclass
class PromptProfile:
    display_name: str
    language: str
    expertise: str  # the label shown to people, e.g. "Expert"
    about: str
    hints: list[str]  # of the active tags, by tag name


@cache
def _profile_sql() -> str:
    links = Profile.tags.through._meta.db_table
    return f"""
        SELECT p.display_name, p.language, p.expertise, p.about,
               COALESCE(array_agg(t.prompt_hint ORDER BY t.name)
                        FILTER (WHERE t.is_active AND t.prompt_hint <> ''), '{{}}')
        FROM {Profile._meta.db_table} p
        LEFT JOIN {links} pt ON pt.profile_id = p.id
        LEFT JOIN {Tag._meta.db_table} t ON t.id = pt.tag_id
        WHERE p.user_id = %s
        GROUP BY p.id
    """


def prompt_profile(*, user_id: int) -> PromptProfile | None:
    """What the system prompt says about the user; None without a profile."""
    with connection.cursor() as cursor:
        cursor.execute(_profile_sql(), [user_id])
        return _prompt_profile(cursor.fetchone())


def _prompt_profile(row: tuple | None) -> PromptProfile | None:
    if row is None:
        return None
    display_name, language, expertise, about, hints = row
    label = dict(Profile.Expertise.choices).get(expertise, expertise)
    return PromptProfile(display_name, language, str(label), about, list(hints))


@dataclass
class Turn:
    id: int
    role: str
    text: str
    pinned: bool = False


@dataclass
class PromptSources:
    history: list[Turn]  # the latest finished turns, newest first
    profile: PromptProfile | None
    summary: str = ""  # what the conversation remembers of older turns
    summary_upto: int = 0  # the newest message id the summary covers (0: none)
    pinned: list[Turn] = field(default_factory=list)  # pinned turns of any age, newest first
    facts: list[dict] = field(default_factory=list)  # memory entries as the summary row keeps them


PINNED_MAX = 20  # pinned turns read per prompt


def prompt_sources(*, conversation: Conversation, limit: int) -> PromptSources:
    """The latest finished user and assistant turns (at most `limit`), the owner's profile, the
    conversation's summary and its pinned turns, in one round trip (a psycopg pipeline of
    statements bound server-side, so the connection prepares them: core/prepared.py)."""
    history_params = [
        conversation.pk,
        Message.Role.USER,
        Message.Role.ASSISTANT,
        Message.Status.DONE,
        limit,
    ]
    with connection.cursor():  # connects, or runs the health check when one is due
        raw = connection.connection
    with (
        connection.wrap_database_errors,
        psycopg.Cursor(raw) as history,
        psycopg.Cursor(raw) as profile,
        psycopg.Cursor(raw) as memory,
    ):
        with raw.pipeline():
            history.execute(_history_sql(), history_params)
            profile.execute(_profile_sql(), [conversation.owner_id])
            memory.execute(
                _memory_sql(),
                {"c": conversation.pk, "done": Message.Status.DONE, "pins": PINNED_MAX},
            )
        sources = PromptSources(
            [Turn(*row) for row in history.fetchall()], _prompt_profile(profile.fetchone())
        )
        for summary, upto, entries, pin_id, role, text in memory.fetchall():
            sources.summary, sources.summary_upto = summary or "", upto or 0
            # Django leaves jsonb undecoded on its connections: a string here.
            entries = json.loads(entries) if isinstance(entries, str) else entries
            sources.facts = entries if isinstance(entries, list) else []
            if pin_id is not None:
                sources.pinned.append(Turn(pin_id, role, text, True))
        return sources


# -- a request's live state (Redis, until it ends) ------------------------------------------


@dataclass
class RequestInfo:
    id: str
    user_id: int
    conversation_id: int | None  # None: a stateless API request (/v1/chat/completions)
    state: str
    notice: str = ""  # told beside the answer: retrieval was unavailable


def request_get_for_user(*, user: User, request_id: str) -> RequestInfo:
    """The request's live state; Http404 when it is unknown, expired or someone else's."""
    if not request_id or len(request_id) > 64:
        raise Http404
    data = get_redis().hgetall(keys().request(request_id))
    if not data or data.get("user_id") != str(user.id):
        raise Http404
    conversation_id = data.get("conversation_id")
    return RequestInfo(
        request_id,
        int(data["user_id"]),
        int(conversation_id) if conversation_id else None,
        data.get("state", ""),
        data.get("notice", ""),
    )
