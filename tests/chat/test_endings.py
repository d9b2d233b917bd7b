"""Honest endings through the real stack (websocket, dispatcher, a worker running SmolLM2): the
bubble hears how much the model reads first, an answer cut at the length cap says so, and
Continue asks for the rest in a new request."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async

from apps.chat.models import Message
from apps.chat.services import conversation_create, message_create
from apps.chat.turns import CONTINUE_INSTRUCTION
from tests.chat.conftest import chat_socket, receive_until, wait_for
from tests.chat.test_request_path import _conversation_free

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("close_thread_connections"),
]


async def test_a_capped_answer_says_so_and_continue_goes_on(
    user, short_answers, start_worker, dispatcher, redis_prefix
):
    start_worker("w1")
    conversation = await sync_to_async(conversation_create)(owner=user)
    async with chat_socket(user, conversation.id) as (ws, _, _):
        # Nothing to continue yet: a clear error.
        await ws.send_to(text_data=json.dumps({"type": "continue"}))
        refused = json.loads(await ws.receive_from(timeout=10))
        assert refused == {"type": "error", "message": "There is no answer to continue."}

        question = "Describe the rivers of Europe, one by one, in detail."
        await ws.send_to(text_data=json.dumps({"type": "send", "text": question}))
        first = await receive_until(ws, "final")
        await wait_for(lambda: _conversation_free(conversation.id, redis_prefix), what="release")
        await ws.send_to(text_data=json.dumps({"type": "continue"}))
        second = await receive_until(ws, "final")

    kinds = [f["type"] for f in first]
    # The reading phase: the start frame says how many tokens the model reads, before any text.
    start = next(f for f in first if f["type"] == "start")
    assert start["prompt_tokens"] > 10
    assert kinds.index("start") < kinds.index("delta")
    # 24 tokens cannot describe Europe's rivers: cut by the cap, and the final frame says so.
    assert first[-1]["state"] == "done" and first[-1]["finish_reason"] == "length"

    # Continue: a new request, no new question, an answer of its own after the cut one.
    assert second[0]["type"] == "request"
    assert second[-1]["request_id"] != first[-1]["request_id"]
    assert second[-1]["state"] == "done" and second[-1]["text"].strip()
    # It read the cut answer and the instruction besides the question; all but the instruction
    # was still in the worker's KV cache (the same worker, the same slot).
    first_prompt, usage = first[-1]["usage"]["prompt_tokens"], second[-1]["usage"]
    assert usage["prompt_tokens"] > first_prompt + 24
    assert usage["cached_tokens"] >= first_prompt
    second_id = second[-1]["request_id"]
    await wait_for(lambda: Message.objects.filter(request_id=second_id).exists(), what="answer")
    messages = await sync_to_async(list)(conversation.messages.order_by("created", "id"))
    assert [m.role for m in messages] == ["user", "assistant", "assistant"]
    assert messages[1].text == first[-1]["text"] and messages[2].text == second[-1]["text"]
    # Why each ended is stored with it, for a page loaded later.
    assert messages[1].finish_reason == "length"
    assert messages[2].finish_reason in ("stop", "length", "loop")
    # The instruction was for that request only.
    assert not any(CONTINUE_INSTRUCTION in m.text for m in messages)


async def test_a_looping_answer_is_stopped_and_says_why(
    user, settings, start_worker, dispatcher, redis_prefix
):
    # Without the repetition penalty, and with a loop in the history to follow, the small model
    # loops at temperature 0.
    settings.MODEL_MAX_TOKENS, settings.MODEL_TEMPERATURE = 200, 0.0
    start_worker("looper", extra=("--repeat-penalty", "1.0"))
    conversation = await sync_to_async(conversation_create)(owner=user)
    create = sync_to_async(message_create)
    await create(conversation=conversation, role="user", text="How should I choose?")
    looped = "You need to know how to decide " + "how to decide " * 15
    await create(conversation=conversation, role="assistant", text=looped)
    async with chat_socket(user, conversation.id) as (ws, _, _):
        await ws.send_to(text_data=json.dumps({"type": "send", "text": "Continue."}))
        final = (await receive_until(ws, "final"))[-1]
    assert final["state"] == "done" and final["finish_reason"] == "loop"
    # Stopped soon after the loop began (about 30 words), well before the cap.
    assert final["usage"]["completion_tokens"] < 100
    request_id = final["request_id"]
    answer = await wait_for(
        lambda: Message.objects.filter(request_id=request_id).first(), what="recorded answer"
    )
    assert answer.text == final["text"]


async def test_with_loop_stopping_off_the_same_answer_runs_to_its_cap(
    user, settings, start_worker, dispatcher, redis_prefix
):
    settings.MODEL_MAX_TOKENS, settings.MODEL_TEMPERATURE = 120, 0.0
    start_worker("free", extra=("--repeat-penalty", "1.0", "--stop-loops", "off"))
    conversation = await sync_to_async(conversation_create)(owner=user)
    create = sync_to_async(message_create)
    await create(conversation=conversation, role="user", text="How should I choose?")
    looped = "You need to know how to decide " + "how to decide " * 15
    await create(conversation=conversation, role="assistant", text=looped)
    async with chat_socket(user, conversation.id) as (ws, _, _):
        await ws.send_to(text_data=json.dumps({"type": "send", "text": "Continue."}))
        final = (await receive_until(ws, "final"))[-1]
    assert final["state"] == "done" and final["finish_reason"] in ("length", "stop")
    assert final["finish_reason"] != "loop"
    if final["finish_reason"] == "length":  # the model's own text, up to the cap
        assert final["usage"]["completion_tokens"] >= 100
