"""Real processes for the request path: workers running the real model, the dispatcher that
records answers, and websocket clients speaking to the real ASGI application."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

from channels.testing import WebsocketCommunicator
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
    communicator = WebsocketCommunicator(application, f"/ws/chat/{conversation_id}/",
                                         headers=headers)  # fmt: skip
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
