"""The hot tier: a warm cache serves the prompt's sources with no PostgreSQL query, every write
goes through (or drops what it changed), and a deleted conversation leaves nothing in Redis."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.accounts.models import Profile, Tag
from apps.chat import selectors
from apps.chat.models import Conversation
from apps.chat.prompt import hot, memory, memory_summary
from apps.chat.prompt.prompting import HISTORY_TURNS_MAX, system_prompt, system_prompt_for
from apps.chat.services import (
    NewMessage,
    conversation_delete,
    message_create,
    messages_store,
)
from core.redis_client import get_redis

pytestmark = pytest.mark.django_db(transaction=True)


REAL_PROMPT_SOURCES = selectors.prompt_sources
postgres_reads = {"count": 0}


@pytest.fixture(autouse=True)
def count_postgres_reads(monkeypatch):
    """Counts the prompt's PostgreSQL read (plain psycopg, which Django's query log misses)."""

    def counted(**kwargs):
        postgres_reads["count"] += 1
        return REAL_PROMPT_SOURCES(**kwargs)

    monkeypatch.setattr(selectors, "prompt_sources", counted)


def sources(conversation) -> tuple:
    """The hot read, and how many PostgreSQL queries it made."""
    before = postgres_reads["count"]
    with CaptureQueriesContext(connection) as queries:
        got = hot.prompt_sources(conversation=conversation, limit=HISTORY_TURNS_MAX)
    return got, len(queries) + postgres_reads["count"] - before


def from_postgres(conversation):
    return REAL_PROMPT_SOURCES(conversation=conversation, limit=HISTORY_TURNS_MAX)


def texts(got) -> list[str]:
    return [t.text for t in got.history]


def test_a_warm_cache_reads_no_postgresql_and_matches_it(chat):
    cold, cold_queries = sources(chat)
    warm, warm_queries = sources(chat)
    assert cold_queries > 0 and warm_queries == 0
    assert warm == cold == from_postgres(chat)
    assert texts(warm) == ["turn 3", "turn 2", "turn 1", "turn 0"]
    assert warm.profile.display_name == "Alice"
    assert system_prompt_for(chat.owner_id).count("Alice") == 1
    with CaptureQueriesContext(connection) as queries:  # made once, then kept
        assert system_prompt_for(chat.owner_id) == system_prompt(warm.profile)
    assert len(queries) == 0


def test_new_turns_are_written_through_single_and_batched(chat):
    sources(chat)
    message_create(conversation=chat, role="user", text="a question")
    messages_store(
        [
            NewMessage(
                conversation=chat, role="assistant", text="the answer", request_id="batch-1"
            ),
            NewMessage(
                conversation=chat,
                role="assistant",
                text="failed",
                request_id="batch-2",
                status="failed",
            ),
        ]
    )
    warm, queries = sources(chat)
    assert queries == 0
    assert texts(warm)[:3] == ["the answer", "a question", "turn 3"]
    assert warm == from_postgres(chat)


def test_a_question_pushed_with_the_read_is_in_that_prompt_and_the_next(chat):
    """The submit path stores its question without a push and hands the turn to the prompt's
    read, which pushes it first in the same round trip."""
    sources(chat)
    question = message_create(conversation=chat, role="user", text="a question", hot_push=False)
    got = hot.prompt_sources(
        conversation=chat, limit=HISTORY_TURNS_MAX, pushed=hot.turn_of(question)
    )
    assert texts(got)[:2] == ["a question", "turn 3"]
    again, queries = sources(chat)
    assert queries == 0 and again == got == from_postgres(chat)


def test_a_question_pushed_on_a_cold_cache_is_read_from_postgresql_once(chat):
    question = message_create(conversation=chat, role="user", text="a question", hot_push=False)
    before = postgres_reads["count"]
    got = hot.prompt_sources(
        conversation=chat, limit=HISTORY_TURNS_MAX, pushed=hot.turn_of(question)
    )
    assert postgres_reads["count"] == before + 1  # not filled yet: the push waits for a fill
    assert texts(got)[0] == "a question"
    warm, queries = sources(chat)
    assert queries == 0 and texts(warm).count("a question") == 1


def test_deletes_edits_pins_and_summaries_drop_the_cached_turns(chat):
    sources(chat)
    chat.messages.filter(text="turn 3").delete()  # e.g. regenerate drops the last answer
    got, queries = sources(chat)
    assert queries > 0 and "turn 3" not in texts(got)

    sources(chat)
    message = chat.messages.get(text="turn 0")
    memory.message_set_pinned(conversation=chat, message_id=message.id, pinned=True)
    got, queries = sources(chat)
    assert queries > 0 and [t.text for t in got.pinned] == ["turn 0"]

    sources(chat)
    memory_summary.summary_store(
        conversation_id=chat.id, upto_message_id=message.id, text="- likes rivers"
    )
    got, queries = sources(chat)
    assert queries > 0 and got.summary == "- likes rivers"
    assert sources(chat)[0] == from_postgres(chat)


def test_profile_and_tag_edits_change_the_cached_system_prompt(chat, user):
    sources(chat)
    profile = Profile.objects.get(user=user)
    profile.display_name = "Alicia"
    profile.save()
    got, queries = sources(chat)
    assert queries > 0 and got.profile.display_name == "Alicia"

    tag = Tag.objects.create(name="teacher", slug="teacher", prompt_hint="The user teaches.")
    sources(chat)
    profile.tags.add(tag)
    assert sources(chat)[0].profile.hints == ["The user teaches."]
    tag.prompt_hint = "The user teaches maths."
    tag.save()
    assert sources(chat)[0].profile.hints == ["The user teaches maths."]
    assert "maths" in system_prompt_for(user.id)


def test_a_fill_that_raced_a_write_is_not_stored(chat):
    stale = from_postgres(chat)  # read before the write below...
    message_create(conversation=chat, role="user", text="newer")  # ...which bumps the generation
    assert (
        get_redis().eval(
            hot.FILL_CONVERSATION,
            2,
            hot.conversation_key(chat.id),
            hot.turns_key(chat.id),
            60,
            "0",
            "",
            0,
            "[]",
            *(hot._entry(t) for t in stale.history),
        )
        == 0
    )
    assert texts(sources(chat)[0])[0] == "newer"


def test_deleting_a_conversation_drops_its_keys(chat):
    sources(chat)
    assert get_redis().exists(hot.conversation_key(chat.id), hot.turns_key(chat.id)) == 2
    conversation_delete(conversation=chat)
    assert get_redis().exists(hot.conversation_key(chat.id), hot.turns_key(chat.id)) == 0
    assert not Conversation.objects.filter(id=chat.id).exists()


def test_with_the_hot_tier_off_every_read_goes_to_postgresql(chat, settings):
    settings.HOT_TIER = False
    sources(chat)
    got, queries = sources(chat)
    assert queries > 0 and got == from_postgres(chat)
    assert not get_redis().exists(hot.turns_key(chat.id))
