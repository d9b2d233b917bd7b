"""Item 12: a websocket is accepted only from the site's own origin (scheme, host and port) or
a trusted one; host names alone are not enough."""

from __future__ import annotations

import asyncio

import pytest
import websockets
from asgiref.sync import sync_to_async

from apps.chat.services import conversation_create
from tests.security.conftest import logged_in, websocket

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_thread_connections"),
]


@pytest.fixture
async def chat(user):
    conversation = await sync_to_async(conversation_create)(owner=user)
    _, session_key = await sync_to_async(logged_in)(user)
    return f"/ws/chat/{conversation.id}/", session_key


async def accepted(path, session_key, **headers) -> bool:
    async with websocket(path, session_key=session_key, **headers) as (_, ok, code):
        assert ok or code == 4403, code
        return ok


async def test_only_the_sockets_own_origin_opens_an_authenticated_socket(chat):
    path, key = chat
    assert await accepted(path, key, origin="http://testserver")
    assert await accepted(path, key, origin="http://127.0.0.1:8123", host="127.0.0.1:8123")
    assert await accepted(path, key, origin="https://testserver", scheme="wss")

    assert not await accepted(path, key, origin="http://testserver:9999")  # another port
    assert not await accepted(path, key, origin="https://testserver")  # another scheme
    assert not await accepted(path, key, origin="http://testserver", scheme="wss")
    assert not await accepted(path, key, origin="http://127.0.0.1", host="127.0.0.1:8123")
    assert not await accepted(path, key, origin="http://evil.example")
    assert not await accepted(path, key, origin="null")
    assert not await accepted(path, key, origin=None)  # no Origin, yet a session cookie


async def test_a_host_outside_allowed_hosts_is_no_origin_of_ours(chat):
    path, key = chat
    # DNS rebinding: the attacker's name, resolving to us, is the page's own origin.
    assert not await accepted(path, key, origin="http://evil.example", host="evil.example")


async def test_trusted_origins_are_accepted_with_their_scheme_and_port(chat, settings):
    path, key = chat
    settings.CSRF_TRUSTED_ORIGINS = ["https://chat.example.org", "https://*.example.net"]
    assert await accepted(path, key, origin="https://chat.example.org")
    assert await accepted(path, key, origin="https://eu.example.net")
    assert not await accepted(path, key, origin="http://chat.example.org")
    assert not await accepted(path, key, origin="https://chat.example.org:8443")


async def test_behind_a_tls_proxy_the_forwarded_scheme_counts(chat, settings):
    path, key = chat
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    headers = [(b"x-forwarded-proto", b"https")]
    from channels.testing import WebsocketCommunicator

    from chatsite.asgi import application

    for origin, expected in (("https://testserver", True), ("http://testserver", False)):
        communicator = WebsocketCommunicator(
            application,
            path,
            headers=[
                (b"host", b"testserver"),
                (b"origin", origin.encode()),
                (b"cookie", f"sessionid={key}".encode()),
                *headers,
            ],
        )
        ok, _ = await communicator.connect(timeout=10)
        await communicator.disconnect()
        assert ok is expected, origin


def test_a_live_server_accepts_its_own_origin_with_its_port(live_web, user):
    """Through daphne: the Host header carries the port, and the page's origin must too."""
    conversation = conversation_create(owner=user)
    _, key = logged_in(user)
    url = live_web.replace("http://", "ws://") + f"/ws/chat/{conversation.id}/"

    async def opens(origin: str) -> bool:
        headers = {"Origin": origin, "Cookie": f"sessionid={key}"}
        try:
            async with websockets.connect(url, additional_headers=headers, open_timeout=10):
                return True
        except websockets.exceptions.InvalidStatus as exc:
            assert exc.response.status_code == 403
            return False

    assert asyncio.run(opens(live_web))
    assert not asyncio.run(opens("http://127.0.0.1"))
    assert not asyncio.run(opens(live_web.replace("http://", "https://")))
