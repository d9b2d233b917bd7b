"""The chat websocket's guards: who may connect, and bad frames get an error, not a dropped
connection."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from apps.chat.models import Message
from apps.chat.services import conversation_create
from apps.chat.submission import Question, request_submit
from tests.chat.conftest import chat_socket, session_cookie

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_thread_connections"),
]


async def test_a_websocket_from_a_foreign_origin_is_refused(user):
    conversation = await sync_to_async(conversation_create)(owner=user)
    async with chat_socket(user, conversation.id, origin=b"http://evil.example") as (_, ok, _):
        assert not ok


async def test_anonymous_and_foreign_conversations_are_refused(user, other_user):
    theirs = await sync_to_async(conversation_create)(owner=other_user)
    async with chat_socket(None, theirs.id) as (_, ok, code):
        assert not ok and code == 4401
    async with chat_socket(user, theirs.id) as (_, ok, code):
        assert not ok and code == 4404
    async with chat_socket(user, 987654) as (_, ok, code):
        assert not ok and code == 4404


async def _error_for(ws, payload: str) -> str:
    await ws.send_to(text_data=payload)
    frame = json.loads(await ws.receive_from(timeout=10))
    assert frame["type"] == "error", frame
    return frame["message"]


async def test_bad_frames_get_clear_errors_and_the_socket_stays_open(user):
    conversation = await sync_to_async(conversation_create)(owner=user)
    async with chat_socket(user, conversation.id) as (ws, ok, _):
        assert ok
        assert "malformed JSON" in await _error_for(ws, "{not json")
        assert "malformed JSON" in await _error_for(ws, json.dumps(["send"]))
        # A lone UTF-16 surrogate is no text: refused at the door, not by the database.
        lone = await _error_for(ws, '{"type": "send", "text": "hi \\ud800"}')
        assert "malformed JSON" in lone and "surrogate" in lone
        assert "Unknown action" in await _error_for(ws, json.dumps({"type": "explode"}))
        assert "Type a message first" in await _error_for(ws, json.dumps({"type": "send"}))
        assert "Type a message first" in await _error_for(
            ws, json.dumps({"type": "send", "text": "   "})
        )
        assert "limit is 8,000" in await _error_for(
            ws, json.dumps({"type": "send", "text": "x" * 9000})
        )
        assert "under 64 KB" in await _error_for(ws, "x" * 70_000)
        assert "Nothing is being generated" in await _error_for(ws, json.dumps({"type": "stop"}))
        # Still connected and working after all that.
        assert "Unknown action" in await _error_for(ws, json.dumps({"type": "?"}))
    assert not await sync_to_async(Message.objects.exists)()


async def test_another_users_request_cannot_be_resumed_or_stopped(user, other_user):
    theirs = await sync_to_async(conversation_create)(owner=other_user)
    submitted = await sync_to_async(request_submit)(
        Question(user=other_user, conversation=theirs, text="secret")
    )
    mine = await sync_to_async(conversation_create)(owner=user)
    async with chat_socket(user, mine.id) as (ws, _, _):
        resume = json.dumps(
            {"type": "resume", "request_id": submitted.request_id, "last_event_id": "0"}
        )
        assert "not found" in await _error_for(ws, resume)
        stop = json.dumps({"type": "stop", "request_id": submitted.request_id})
        assert "not found" in await _error_for(ws, stop)


async def test_a_second_question_waits_for_the_answer_in_progress(user):
    conversation = await sync_to_async(conversation_create)(owner=user)
    async with chat_socket(user, conversation.id) as (ws, _, _):
        await ws.send_to(text_data=json.dumps({"type": "send", "text": "first"}))
        kinds = [json.loads(await ws.receive_from(timeout=10))["type"] for _ in range(3)]
        assert kinds == ["user_message", "request", "status"]
        message = await _error_for(ws, json.dumps({"type": "send", "text": "second"}))
        assert "Wait for the current answer" in message


async def test_when_redis_is_unreachable_sending_fails_closed_and_keeps_the_draft(
    user, monkeypatch
):
    import redis as redis_lib

    from apps.chat import submission
    from devstack.stack import free_port

    conversation = await sync_to_async(conversation_create)(owner=user)
    unreachable = redis_lib.Redis(port=free_port(), socket_connect_timeout=0.5)
    async with chat_socket(user, conversation.id) as (ws, _, _):
        monkeypatch.setattr(submission, "get_redis", lambda: unreachable)
        await ws.send_to(text_data=json.dumps({"type": "send", "text": "are you there?"}))
        frame = json.loads(await ws.receive_from(timeout=10))
    assert frame["type"] == "error"
    assert "cannot take new questions right now" in frame["message"]
    assert frame["draft"] == "are you there?"
    assert not await sync_to_async(Message.objects.exists)()


async def test_a_question_to_a_conversation_deleted_meanwhile_gets_a_clear_error(user):
    """Deleted from another process while the socket is open: the question's insert finds no
    conversation, so nothing is stored or sent, and the socket says why."""
    from apps.chat.models import Conversation

    conversation = await sync_to_async(conversation_create)(owner=user)
    async with chat_socket(user, conversation.id) as (ws, ok, _):
        assert ok
        await sync_to_async(Conversation.objects.filter(pk=conversation.pk).delete)()
        message = await _error_for(ws, json.dumps({"type": "send", "text": "anyone?"}))
        assert "no longer exists" in message
        assert "Unknown action" in await _error_for(ws, json.dumps({"type": "?"}))  # still open
    assert not await sync_to_async(Message.objects.exists)()


async def test_sockets_open_answer_and_close_while_the_shared_sync_thread_is_busy(user):
    """Channels logs a socket in, and tidies database connections before each message a
    consumer handles, in one sync thread shared by the whole process: after a web restart every
    page's sockets would queue there. Sluice's two sockets never wait on it."""
    from chatsite.asgi import application

    conversation = await sync_to_async(conversation_create)(owner=user)
    headers = [
        (b"origin", b"http://testserver"),
        (b"host", b"testserver"),
        (b"cookie", await sync_to_async(session_cookie)(user)),
    ]
    release = threading.Event()
    busy = asyncio.ensure_future(sync_to_async(release.wait)())  # holds the shared thread
    try:
        for path in (f"/ws/chat/{conversation.id}/", "/ws/inbox/"):
            ws = WebsocketCommunicator(application, path, headers=headers)
            connected, code = await ws.connect(timeout=10)
            assert connected, (path, code)
            if path.startswith("/ws/chat/"):
                assert "Unknown action" in await _error_for(ws, json.dumps({"type": "?"}))
            await ws.disconnect(timeout=10)
            # The socket's close ended its consumer by itself, not the timeout's cancel.
            assert ws.future.done() and not ws.future.cancelled(), path
        assert not busy.done()  # all of that while the shared thread was held
    finally:
        release.set()
        await busy
