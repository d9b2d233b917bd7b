"""Bulk writes (QuerySet.update(), bulk_update(), bulk_create()) reach the hot tier like saves:
the next prompt reads what they wrote, not what the cache held."""

from __future__ import annotations

import pytest

from apps.accounts.models import Profile, Tag
from apps.chat.models import ConversationSummary, Message
from apps.chat.prompt import hot
from apps.chat.prompt.prompting import HISTORY_TURNS_MAX, system_prompt_for

pytestmark = pytest.mark.django_db(transaction=True)


def warm(conversation):
    """The prompt's sources through the hot tier (filling it when cold)."""
    return hot.prompt_sources(conversation=conversation, limit=HISTORY_TURNS_MAX)


def texts(conversation) -> list[str]:
    return [t.text for t in warm(conversation).history]


def test_message_updates_in_bulk_reach_the_next_prompt(chat):
    warm(chat)
    Message.objects.filter(conversation=chat, text="turn 3").update(text="turn 3, edited")
    assert texts(chat)[0] == "turn 3, edited"
    chat.messages.filter(text="turn 0").update(pinned=True)  # through the related manager
    assert [t.text for t in warm(chat).pinned] == ["turn 0"]
    first = chat.messages.get(text="turn 1")
    first.text = "turn 1, rewritten"
    Message.objects.bulk_update([first], ["text"])
    assert "turn 1, rewritten" in texts(chat)


def test_messages_created_in_bulk_reach_the_next_prompt(chat):
    warm(chat)
    Message.objects.bulk_create([Message(conversation=chat, role="user", text="bulk question")])
    assert texts(chat)[0] == "bulk question"


def test_summary_updates_in_bulk_reach_the_next_prompt(chat):
    ConversationSummary.objects.create(conversation=chat, text="- old", upto_message_id=0)
    assert warm(chat).summary == "- old"
    ConversationSummary.objects.filter(conversation=chat).update(text="- new")
    assert warm(chat).summary == "- new"


def test_profile_and_tag_updates_in_bulk_reach_the_system_prompt(chat, user):
    warm(chat)
    assert "Alice" in system_prompt_for(user.id)
    Profile.objects.filter(user=user).update(display_name="Alicia")
    assert warm(chat).profile.display_name == "Alicia"
    assert "Alicia" in system_prompt_for(user.id)
    tag = Tag.objects.create(name="teacher", slug="teacher", prompt_hint="The user teaches.")
    Profile.objects.get(user=user).tags.add(tag)
    assert "The user teaches." in system_prompt_for(user.id)
    Tag.objects.filter(pk=tag.pk).update(prompt_hint="The user teaches maths.")
    assert warm(chat).profile.hints == ["The user teaches maths."]
    assert "maths" in system_prompt_for(user.id)
