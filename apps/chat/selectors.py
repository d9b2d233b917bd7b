"""Reads for chat. Every lookup by id goes through a *_for_user helper, which 404s for ids
the user does not own."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import psycopg
from django.db import connection
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from apps.accounts.models import Profile, Tag, User

from .models import Conversation, Message


def conversation_list_for_user(*, user: User, archived: bool = False) -> QuerySet[Conversation]:
    return Conversation.objects.filter(owner=user, archived=archived)


def conversation_get_for_user(*, user: User, id: int) -> Conversation:
    return get_object_or_404(Conversation, owner=user, id=id)


def message_list_for_conversation(*, conversation: Conversation) -> QuerySet[Message]:
    return conversation.messages.all()


# The two reads behind every prompt run on each message sent, so they are plain SQL (the ORM
# spends more CPU compiling these small queries than PostgreSQL spends answering them) sent
# together in one round trip.


@cache
def _history_sql() -> str:
    return f"""
        SELECT role, text FROM {Message._meta.db_table}
        WHERE conversation_id = %s AND role IN (%s, %s) AND status = %s
        ORDER BY created DESC, id DESC LIMIT %s
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
class PromptSources:
    history: list[tuple[str, str]]  # the latest finished turns, newest first: (role, text)
    profile: PromptProfile | None


def prompt_sources(*, conversation: Conversation, limit: int) -> PromptSources:
    """The latest finished user and assistant turns (at most `limit`) and the owner's profile,
    in one round trip (a psycopg pipeline)."""
    history_params = [conversation.pk, Message.Role.USER, Message.Role.ASSISTANT,
                      Message.Status.DONE, limit]  # fmt: skip
    with connection.cursor():  # connects, or runs the health check when one is due
        raw = connection.connection
    with (
        connection.wrap_database_errors,
        psycopg.ClientCursor(raw) as history,
        psycopg.ClientCursor(raw) as profile,
    ):
        with raw.pipeline():
            history.execute(_history_sql(), history_params)
            profile.execute(_profile_sql(), [conversation.owner_id])
        return PromptSources(history.fetchall(), _prompt_profile(profile.fetchone()))
