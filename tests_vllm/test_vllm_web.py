"""The browser-facing path answered by vLLM: the chat websocket (the real ASGI application) and
the dispatcher that records answers, in the main venv, against the `--engine vllm` worker."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async

from apps.chat.models import Message
from apps.chat.services import conversation_create
from tests.chat.conftest import chat_socket, receive_until, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("close_thread_connections"),
]


async def test_a_chat_in_the_browser_is_answered_by_the_vllm_worker(
    user, settings, redis_prefix, vllm_worker, dispatcher
):
    settings.MODEL_MAX_TOKENS = 32
    settings.MODEL_TEMPERATURE = 0.0
    conversation = await sync_to_async(conversation_create)(owner=user)
    async with chat_socket(user, conversation.id) as (ws, connected, _):
        assert connected
        await ws.send_to(
            text_data=json.dumps({"type": "send", "text": "What is the capital of France?"})
        )
        frames = await receive_until(ws, "final")

    kinds = [f["type"] for f in frames]
    assert "delta" in kinds
    start = next(f for f in frames if f["type"] == "start")
    assert start["worker"] == vllm_worker.worker_id
    final = frames[-1]
    assert final["state"] == "done", final
    assert final["text"].strip()

    request_id = next(f["request_id"] for f in frames if f["type"] == "request")
    answer = await wait_for(
        lambda: Message.objects.filter(request_id=request_id).first(), what="recorded answer"
    )
    assert (answer.role, answer.text, answer.status) == ("assistant", final["text"], "done")
