"""The prompt: a system prompt from the profile and its tags, then the turns that fit."""

from __future__ import annotations

from apps.accounts.models import Profile, Tag
from apps.chat.models import Message
from apps.chat.prompt.prompting import BASE_SYSTEM_PROMPT, prompt_build, system_prompt_for
from apps.chat.services import conversation_create, message_create


def test_system_prompt_says_what_the_profile_and_active_tags_say(user):
    assert system_prompt_for(user.pk).startswith(BASE_SYSTEM_PROMPT)
    profile, _ = Profile.objects.get_or_create(user=user)
    profile.display_name, profile.language, profile.expertise = "Alice", "French", "expert"
    profile.about = "I teach physics."
    profile.save()
    profile.tags.add(
        Tag.objects.create(name="Zoologist", slug="zoo", prompt_hint="Likes animals."),
        Tag.objects.create(name="Astronomer", slug="astro", prompt_hint="Likes stars."),
        Tag.objects.create(name="Retired", slug="old", prompt_hint="Old hint.", is_active=False),
        Tag.objects.create(name="Blank", slug="blank"),
    )
    lines = system_prompt_for(user.pk).splitlines()
    assert lines[1:] == [
        "The user's name is Alice.",
        "Answer in French.",
        "The user's expertise level is expert.",
        'The user says about themselves: "I teach physics."',
        "Likes stars.",  # tags by name; inactive and empty hints left out
        "Likes animals.",
    ]


def test_prompt_keeps_the_latest_finished_turns_that_fit(user, settings):
    settings.MODEL_CONTEXT_TOKENS, settings.MODEL_MAX_TOKENS = 400, 100
    conversation = conversation_create(owner=user)
    for n in range(30):
        message_create(conversation=conversation, role="user", text=f"question {n} " * 10)
        message_create(
            conversation=conversation,
            role="assistant",
            text=f"answer {n} " * 10,
            request_id=f"r{n}",
        )
    message_create(
        conversation=conversation,
        role="assistant",
        text="half an answer",
        request_id="stopped",
        status=Message.Status.CANCELLED,
    )
    message_create(conversation=conversation, role="user", text="the last question")
    prompt = prompt_build(conversation=conversation)
    turns = prompt.messages[1:]
    assert prompt.messages[0]["role"] == "system"
    assert turns[-1] == {"role": "user", "content": "the last question"}
    assert all("half an answer" not in t["content"] for t in turns)  # only finished turns
    assert turns[-2]["content"].startswith("answer 29")  # the newest, in order
    assert 2 < len(turns) < 61  # the window cut the oldest
    assert prompt.prompt_tokens_estimate <= 400 - 100


def test_passages_sit_just_before_the_question_so_the_turns_keep_their_prefix(user):
    conversation = conversation_create(owner=user)
    message_create(conversation=conversation, role="user", text="first question")
    message_create(conversation=conversation, role="assistant", text="an answer", request_id="r1")
    message_create(conversation=conversation, role="user", text="second question")
    first = prompt_build(conversation=conversation, passages="<passages>A</passages>")
    message_create(conversation=conversation, role="assistant", text="answer 2", request_id="r2")
    message_create(conversation=conversation, role="user", text="third question")
    second = prompt_build(conversation=conversation, passages="<passages>B</passages>")
    assert "<passages>" not in second.messages[0]["content"]
    assert second.messages[-2:] == [
        {"role": "user", "content": "<passages>B</passages>"},
        {"role": "user", "content": "third question"},
    ]
    # The follow-up repeats its predecessor's prompt up to the previous passages.
    assert second.messages[:3] == first.messages[:3]


def test_message_create_titles_a_new_chat_and_stores_an_answer_once(user):
    conversation = conversation_create(owner=user)
    message_create(conversation=conversation, role="user", text="  How do rivers form?  ")
    conversation.refresh_from_db()
    assert conversation.title == "How do rivers form?"
    message_create(conversation=conversation, role="user", text="A second question")
    conversation.refresh_from_db()
    assert conversation.title == "How do rivers form?"  # only the first question names it
    first = message_create(
        conversation=conversation,
        role="assistant",
        text="Rain.",
        request_id="req-1",
        citations=[{"number": 1}],
    )
    again = message_create(
        conversation=conversation, role="assistant", text="Rain.", request_id="req-1"
    )
    assert first is not None and again is None
    stored = Message.objects.get(request_id="req-1")
    assert (stored.pk, stored.citations) == (first.pk, [{"number": 1}])
    assert list(conversation.messages.values_list("role", flat=True)) == [
        "user",
        "user",
        "assistant",
    ]
