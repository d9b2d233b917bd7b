"""The request path end to end: websocket → Redis Streams → a real worker running SmolLM2 →
tokens back to the browser → the answer recorded in PostgreSQL by the dispatcher."""

from __future__ import annotations

import json
import signal
import time

import pytest
from asgiref.sync import sync_to_async

from apps.chat.models import Message
from apps.chat.services import conversation_create
from contract.protocol import Keys
from core.redis_client import get_redis
from tests.chat.conftest import answer_text, chat_socket, receive_until, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("close_thread_connections"),
]


def live_workers(prefix: str) -> set[str]:
    client = get_redis()  # one Redis or a cluster, whichever REDIS_URL names
    keys = Keys(prefix=prefix)
    return {w for w in client.zrange(keys.workers, 0, -1) if client.exists(keys.heartbeat(w))}


async def test_chat_round_trip_through_a_real_worker_and_model(
    user, short_answers, start_worker, dispatcher
):
    conversation = await sync_to_async(conversation_create)(owner=user)
    start_worker("w1")
    async with chat_socket(user, conversation.id) as (ws, connected, _):
        assert connected
        await ws.send_to(text_data=json.dumps({"type": "send", "text": "Name a primary colour."}))
        frames = await receive_until(ws, "final")

    kinds = [f["type"] for f in frames]
    assert kinds[0] == "user_message" and kinds[1] == "request"
    assert "delta" in kinds
    final = frames[-1]
    assert final["state"] == "done"
    assert final["text"].strip()
    assert answer_text(frames) == final["text"]
    assert final["usage"]["completion_tokens"] > 0 and final["usage"]["prompt_tokens"] > 0

    request_id = frames[1]["request_id"]
    answer = await wait_for(
        lambda: Message.objects.filter(request_id=request_id).first(), what="recorded answer"
    )
    assert (answer.role, answer.text, answer.status) == ("assistant", final["text"], "done")
    assert answer.conversation_id == conversation.id
    assert answer.completion_tokens == final["usage"]["completion_tokens"]


async def test_killed_worker_answer_is_finished_by_another_and_stored_once(
    user, settings, start_worker, dispatcher, redis_prefix
):
    settings.MODEL_MAX_TOKENS = 200
    settings.MODEL_TEMPERATURE = 0.0
    workers = {"wa": start_worker("wa"), "wb": start_worker("wb")}
    await wait_for(
        lambda: live_workers(redis_prefix) == {"wa", "wb"},
        timeout=120,
        what="both workers to load the model",
    )
    conversation = await sync_to_async(conversation_create)(owner=user)
    async with chat_socket(user, conversation.id) as (ws, _, _):
        prompt = "Write a long story about a dragon who learns to bake bread."
        await ws.send_to(text_data=json.dumps({"type": "send", "text": prompt}))
        frames = await receive_until(ws, "delta")
        first_worker = next(f["worker"] for f in frames if f["type"] == "start")
        workers[first_worker].send_signal(signal.SIGKILL)
        frames += await receive_until(ws, "final", timeout=180)

    final = frames[-1]
    starts = [f for f in frames if f["type"] == "start"]
    assert final["state"] == "done", final
    assert [s["attempt"] for s in starts] == [1, 2]
    assert starts[1]["worker"] != first_worker
    assert answer_text(frames) == final["text"]
    request_id = frames[1]["request_id"]
    await wait_for(lambda: Message.objects.filter(request_id=request_id).exists(), what="answer")
    assert (
        await sync_to_async(
            Message.objects.filter(conversation=conversation, role="assistant").count
        )()
        == 1
    )


async def test_stop_aborts_the_answer_and_frees_the_slot(
    user, settings, start_worker, dispatcher, redis_prefix
):
    settings.MODEL_MAX_TOKENS = 400
    start_worker("solo", slots=1)
    conversation = await sync_to_async(conversation_create)(owner=user)
    async with chat_socket(user, conversation.id) as (ws, _, _):
        await ws.send_to(
            text_data=json.dumps({"type": "send", "text": "Write a very long essay about rivers."})
        )
        await receive_until(ws, "delta")
        stopped_at = time.monotonic()
        await ws.send_to(text_data=json.dumps({"type": "stop"}))
        frames = await receive_until(ws, "final")
        assert frames[-1]["state"] == "cancelled"
        assert frames[-1]["usage"]["completion_tokens"] < 400
        assert time.monotonic() - stopped_at < 10

        # The single slot is free again: the next question is answered.
        settings.MODEL_MAX_TOKENS = 8
        await wait_for(
            lambda: _conversation_free(conversation.id, redis_prefix), what="conversation released"
        )
        await ws.send_to(text_data=json.dumps({"type": "send", "text": "Say hi."}))
        frames = await receive_until(ws, "final")
        assert frames[-1]["state"] == "done"

    answers = Message.objects.filter(conversation=conversation, role="assistant")
    await wait_for(lambda: answers.count() == 2, what="both answers recorded")
    stored = await sync_to_async(list)(answers.order_by("id"))
    assert [m.status for m in stored] == ["cancelled", "done"]


def _conversation_free(conversation_id: int, prefix: str) -> bool:
    return not get_redis().exists(Keys(prefix=prefix).conversation_active(conversation_id))


async def test_regenerate_replaces_the_last_answer(
    user, short_answers, start_worker, dispatcher, redis_prefix
):
    start_worker("w1")
    conversation = await sync_to_async(conversation_create)(owner=user)
    async with chat_socket(user, conversation.id) as (ws, _, _):
        await ws.send_to(text_data=json.dumps({"type": "send", "text": "Name a fruit."}))
        first = await receive_until(ws, "final")
        await wait_for(lambda: _conversation_free(conversation.id, redis_prefix), what="release")
        await ws.send_to(text_data=json.dumps({"type": "regenerate"}))
        second = await receive_until(ws, "final")
    assert second[0]["type"] == "regenerating"
    assert second[-1]["request_id"] != first[-1]["request_id"]
    second_id = second[-1]["request_id"]
    await wait_for(lambda: Message.objects.filter(request_id=second_id).exists(), what="answer")
    answers = await sync_to_async(list)(
        Message.objects.filter(conversation=conversation, role="assistant")
    )
    assert [a.request_id for a in answers] == [second_id]
    users = await sync_to_async(
        Message.objects.filter(conversation=conversation, role="user").count
    )()
    assert users == 1


async def test_a_new_tab_during_an_answer_shows_the_text_so_far_and_continues(
    user, settings, start_worker, dispatcher
):
    settings.MODEL_MAX_TOKENS = 120
    worker = start_worker("w1")
    conversation = await sync_to_async(conversation_create)(owner=user)
    async with chat_socket(user, conversation.id) as (first_tab, _, _):
        await first_tab.send_to(
            text_data=json.dumps(
                {"type": "send", "text": "Tell me a long story about a lighthouse keeper."}
            )
        )
        first_frames = await receive_until(first_tab, "delta")
        # Held mid-answer while the second tab opens: a short answer could otherwise end, and
        # be stored, before the tab asks for the answer in progress.
        worker.send_signal(signal.SIGSTOP)
        try:
            async with chat_socket(user, conversation.id) as (second_tab, _, _):
                worker.send_signal(signal.SIGCONT)
                second_frames = await receive_until(second_tab, "final")
        finally:
            worker.send_signal(signal.SIGCONT)
        first_frames += await receive_until(first_tab, "final")
    assert second_frames[-1]["text"] == first_frames[-1]["text"]
    assert answer_text(second_frames) == answer_text(first_frames) == first_frames[-1]["text"]
