"""Every write reaches the next prompt: new turns (one by one and batched), deletes, edits,
pins and summaries, profile and tag edits, bulk writes (QuerySet.update(), bulk_update(),
bulk_create()), and a deleted conversation leaves nothing behind."""

from __future__ import annotations

import pytest

from apps.accounts.models import Profile, Tag
from apps.chat import selectors
from apps.chat.models import Conversation, ConversationSummary, Message
from apps.chat.prompt import memory, memory_summary
from apps.chat.prompt.prompting import HISTORY_TURNS_MAX, system_prompt, system_prompt_for
from apps.chat.services import (
    NewMessage,
    conversation_delete,
    message_create,
    messages_store,
)

pytestmark = pytest.mark.django_db


def sources(conversation):
    """What the next prompt is built from."""
    return selectors.prompt_sources(conversation=conversation, limit=HISTORY_TURNS_MAX)


def texts(got) -> list[str]:
    return [t.text for t in got.history]


def test_the_prompt_holds_the_turns_newest_first_and_the_owners_profile(chat):
    got = sources(chat)
    assert texts(got) == ["turn 3", "turn 2", "turn 1", "turn 0"]
    assert got.profile.display_name == "Alice"
    assert system_prompt_for(chat.owner_id).count("Alice") == 1
    assert system_prompt_for(chat.owner_id) == system_prompt(got.profile)


def test_new_turns_reach_the_next_prompt_single_and_batched(chat):
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
    assert texts(sources(chat))[:3] == ["the answer", "a question", "turn 3"]


def test_deletes_edits_pins_and_summaries_reach_the_next_prompt(chat):
    chat.messages.filter(text="turn 3").delete()  # e.g. regenerate drops the last answer
    assert "turn 3" not in texts(sources(chat))

    message = chat.messages.get(text="turn 0")
    memory.message_set_pinned(conversation=chat, message_id=message.id, pinned=True)
    assert [t.text for t in sources(chat).pinned] == ["turn 0"]

    memory_summary.summary_store(
        conversation_id=chat.id, upto_message_id=message.id, text="- likes rivers"
    )
    assert sources(chat).summary == "- likes rivers"


def test_profile_and_tag_edits_change_the_system_prompt(chat, user):
    profile = Profile.objects.get(user=user)
    profile.display_name = "Alicia"
    profile.save()
    assert sources(chat).profile.display_name == "Alicia"

    tag = Tag.objects.create(name="teacher", slug="teacher", prompt_hint="The user teaches.")
    profile.tags.add(tag)
    assert sources(chat).profile.hints == ["The user teaches."]
    tag.prompt_hint = "The user teaches maths."
    tag.save()
    assert sources(chat).profile.hints == ["The user teaches maths."]
    assert "maths" in system_prompt_for(user.id)


def test_deleting_a_conversation_leaves_nothing(chat):
    conversation_delete(conversation=chat)
    assert not Conversation.objects.filter(id=chat.id).exists()
    assert not Message.objects.filter(conversation_id=chat.id).exists()


def test_message_updates_in_bulk_reach_the_next_prompt(chat):
    Message.objects.filter(conversation=chat, text="turn 3").update(text="turn 3, edited")
    assert texts(sources(chat))[0] == "turn 3, edited"
    chat.messages.filter(text="turn 0").update(pinned=True)  # through the related manager
    assert [t.text for t in sources(chat).pinned] == ["turn 0"]
    first = chat.messages.get(text="turn 1")
    first.text = "turn 1, rewritten"
    Message.objects.bulk_update([first], ["text"])
    assert "turn 1, rewritten" in texts(sources(chat))


def test_messages_created_in_bulk_reach_the_next_prompt(chat):
    Message.objects.bulk_create([Message(conversation=chat, role="user", text="bulk question")])
    assert texts(sources(chat))[0] == "bulk question"


def test_summary_updates_in_bulk_reach_the_next_prompt(chat):
    ConversationSummary.objects.create(conversation=chat, text="- old", upto_message_id=0)
    assert sources(chat).summary == "- old"
    ConversationSummary.objects.filter(conversation=chat).update(text="- new")
    assert sources(chat).summary == "- new"


def test_profile_and_tag_updates_in_bulk_reach_the_system_prompt(chat, user):
    assert "Alice" in system_prompt_for(user.id)
    Profile.objects.filter(user=user).update(display_name="Alicia")
    assert sources(chat).profile.display_name == "Alicia"
    assert "Alicia" in system_prompt_for(user.id)
    tag = Tag.objects.create(name="teacher", slug="teacher", prompt_hint="The user teaches.")
    Profile.objects.get(user=user).tags.add(tag)
    assert "The user teaches." in system_prompt_for(user.id)
    Tag.objects.filter(pk=tag.pk).update(prompt_hint="The user teaches maths.")
    assert sources(chat).profile.hints == ["The user teaches maths."]
    assert "maths" in system_prompt_for(user.id)
