"""Real processes for the request path: workers running the real model, the dispatcher that
records answers, and websocket clients speaking to the real ASGI application."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections
from django.test import Client


def session_cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


@asynccontextmanager
async def chat_socket(user, conversation_id: int, *, origin: bytes = b"http://testserver"):
    from chatsite.asgi import application

    headers = [(b"origin", origin), (b"host", b"testserver")]
    if user is not None:
        from asgiref.sync import sync_to_async

        headers.append((b"cookie", await sync_to_async(session_cookie)(user)))
    communicator = WebsocketCommunicator(
        application, f"/ws/chat/{conversation_id}/", headers=headers
    )
    connected, code = await communicator.connect(timeout=10)
    try:
        yield communicator, connected, code
    finally:
        await communicator.disconnect()


async def receive_until(communicator, frame_type: str, *, timeout: float = 120) -> list[dict]:
    """Frames received up to and including the first of `frame_type`."""
    frames = []
    while True:
        frame = json.loads(await communicator.receive_from(timeout=timeout))
        frames.append(frame)
        if frame["type"] == frame_type:
            return frames


@pytest.fixture
async def close_thread_connections():
    """ORM calls made through sync_to_async open a connection in asgiref's worker thread; closed
    there, so that the test database can be dropped at the end of the session."""
    yield
    await sync_to_async(connections.close_all)()


async def wait_for(check, *, timeout: float = 30, what: str = "condition"):
    """Polls a synchronous check (ORM, Redis) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await sync_to_async(check)()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def answer_text(frames: list[dict]) -> str:
    """The text a reader shows: the deltas since the last attempt started (a re-run after a
    worker died replays the answer from its start)."""
    text = ""
    for frame in frames:
        if frame["type"] == "start":
            text = ""
        elif frame["type"] == "delta":
            text += frame["text"]
    return text


@pytest.fixture
def chat(user):
    """A conversation of four turns, its owner with a profile."""
    from apps.accounts.models import Profile
    from apps.chat.services import conversation_create, message_create

    Profile.objects.update_or_create(user=user, defaults={"display_name": "Alice"})
    conversation = conversation_create(owner=user, title="Rivers")
    for n in range(4):
        message_create(
            conversation=conversation,
            role="user" if n % 2 == 0 else "assistant",
            text=f"turn {n}",
            request_id=None if n % 2 == 0 else f"r{n}",
        )
    return conversation
