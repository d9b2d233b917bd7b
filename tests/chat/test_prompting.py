"""The prompt: a system prompt from the profile and its tags, then the turns that fit."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from django.conf import settings as django_settings

from apps.accounts.models import Profile, Tag
from apps.chat.models import Message
from apps.chat.prompt.prompting import BASE_SYSTEM_PROMPT, prompt_build, system_prompt_for
from apps.chat.services import conversation_create, message_create
from contract.protocol import Keys
from worker.engines.simulated import SimulatedEngine
from worker.heartbeat import WorkerStats, beat


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


def worker_beats(redis_prefix: str, worker_id: str, model: str, context: int | None) -> None:
    """One heartbeat of a worker serving `model` on an engine whose window is `context`, as the
    worker writes it."""

    async def run() -> None:
        client = aioredis.Redis.from_url(django_settings.REDIS_URL, decode_responses=True)
        try:
            await beat(
                client,
                Keys(prefix=redis_prefix),
                worker_id=worker_id,
                engine=SimulatedEngine(context_tokens=context),
                model=model,
                slots=2,
                running=[],
                stats=WorkerStats(),
                draining=False,
                interval=30,
            )
        finally:
            await client.aclose()

    asyncio.run(run())


def long_conversation(user, model: str):
    conversation = conversation_create(owner=user)
    conversation.model = model
    conversation.save(update_fields=["model"])
    for n in range(30):
        message_create(conversation=conversation, role="user", text=f"question {n} " * 10)
        message_create(
            conversation=conversation,
            role="assistant",
            text=f"answer {n} " * 10,
            request_id=f"c{conversation.pk}-r{n}",  # an answer's id is unique across chats
        )
    message_create(conversation=conversation, role="user", text="the last question")
    return conversation


def test_each_models_prompt_fits_the_window_its_workers_report(user, redis_prefix, settings):
    """A fleet of a small-window and a large-window model: each conversation's prompt keeps
    what its own model holds, not what one setting says for every model."""
    settings.MODEL_CONTEXT_TOKENS, settings.MODEL_MAX_TOKENS = 400, 100
    settings.SLUICE_DEFAULT_MODEL = "large"
    worker_beats(redis_prefix, "s1", "small", 600)
    worker_beats(redis_prefix, "l1", "large", 8000)
    worker_beats(redis_prefix, "l2", "large", 6000)  # the smaller of a model's workers counts

    small = prompt_build(conversation=long_conversation(user, "small"))
    large = prompt_build(conversation=long_conversation(user, "large"))
    default = prompt_build(conversation=long_conversation(user, ""))

    assert 400 < small.prompt_tokens_estimate <= 600 - 100
    assert len(small.messages) < 62  # the window cut the oldest turns
    assert len(large.messages) == 62  # the system prompt and every turn
    assert large.prompt_tokens_estimate <= 6000 - 100
    assert default.messages[1:] == large.messages[1:]  # the default model is "large"


def test_a_model_whose_workers_report_no_window_gets_model_context_tokens(
    user, redis_prefix, settings
):
    settings.MODEL_CONTEXT_TOKENS, settings.MODEL_MAX_TOKENS = 400, 100
    worker_beats(redis_prefix, "u1", "upstream", None)  # an openai engine given no window
    worker_beats(redis_prefix, "s1", "small", 600)

    settings.SLUICE_DEFAULT_MODEL = ""

    upstream = prompt_build(conversation=long_conversation(user, "upstream"))
    small = prompt_build(conversation=long_conversation(user, "small"))
    # A request naming no model, with no default configured, may run on either.
    anywhere = prompt_build(conversation=long_conversation(user, ""))
    assert upstream.prompt_tokens_estimate <= 400 - 100
    assert 400 < small.prompt_tokens_estimate <= 600 - 100
    assert anywhere.messages[1:] == upstream.messages[1:]
