"""An SSE stream ends with the login that opened it: an API key revoked, a session logged out,
a user deactivated or suspended. The stream says `session_ended` and closes, as a websocket
does, while the answer it followed is still running. Over real HTTP against a real daphne, the
dispatcher and a simulated worker with a long answer."""

from __future__ import annotations

import threading

import httpx
import pytest
from django.contrib.auth import logout
from django.contrib.sessions.backends.db import SessionStore
from django.test import Client, RequestFactory

from apps.accounts.services import api_key_create, user_suspend
from apps.chat.services import conversation_create
from contract.protocol import Keys
from core.redis_client import get_redis
from tests.conftest import read_sse, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LONG = ("--sim-tokens", "3000", "--sim-first-token-ms", "5", "--sim-decode-ms", "10")


@pytest.fixture
def slow_worker(start_worker, dispatcher, redis_prefix):
    start_worker("slow", engine="simulated", extra=LONG)
    keys = Keys(prefix=redis_prefix)
    wait_until(lambda: get_redis().exists(keys.heartbeat("slow")), what="the worker to beat")


def bearer(raw: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {raw}"}


def follow(client: httpx.Client, events_url: str) -> tuple[list[dict], threading.Thread]:
    """Reads the stream on a thread; the events land in the list as they arrive."""
    events: list[dict] = []

    def read() -> None:
        with client.stream("GET", events_url) as response:
            assert response.status_code == 200
            read_sse(response, into=events)

    reader = threading.Thread(target=read)
    reader.start()
    wait_until(lambda: any(e["event"] == "delta" for e in events), what="the answer to stream")
    return events, reader


def ended_by_login(events: list[dict], reader: threading.Thread) -> None:
    reader.join(timeout=30)
    assert not reader.is_alive(), "the stream outlived its login"
    assert events[-1]["event"] == "session_ended"
    assert not any(e["event"] == "final" for e in events)  # the answer was still running


def submit(client: httpx.Client, user) -> str:
    conversation = conversation_create(owner=user)
    response = client.post(
        "/api/v1/requests", json={"text": "Tell me everything.", "conversation": conversation.id}
    )
    assert response.status_code == 202, response.text
    return response.json()["events_url"]


def test_revoking_the_key_ends_its_streams(live_web, user, slow_worker):
    key, raw = api_key_create(user=user, name="temp")
    with httpx.Client(base_url=live_web, headers=bearer(raw), timeout=60) as client:
        events, reader = follow(client, submit(client, user))
        key.revoked = True
        key.save()
        ended_by_login(events, reader)


def test_deactivating_the_user_ends_their_streams(live_web, user, slow_worker):
    _, raw = api_key_create(user=user, name="temp")
    with httpx.Client(base_url=live_web, headers=bearer(raw), timeout=60) as client:
        events, reader = follow(client, submit(client, user))
        user.is_active = False
        user.save()
        ended_by_login(events, reader)


def test_suspending_the_user_ends_their_streams(live_web, user, slow_worker):
    _, raw = api_key_create(user=user, name="temp")
    with httpx.Client(base_url=live_web, headers=bearer(raw), timeout=60) as client:
        events, reader = follow(client, submit(client, user))
        user_suspend(user=user, reason="Spam sent through the API", until=None, by=None)
        ended_by_login(events, reader)
        assert client.post("/api/v1/requests", json={"text": "again"}).status_code == 401


def test_logging_out_ends_the_sessions_streams_and_no_other(live_web, user, slow_worker):
    browser = Client()
    browser.force_login(user)
    session_key = browser.cookies["sessionid"].value
    _, raw = api_key_create(user=user, name="script")
    cookies = {"sessionid": session_key}
    with (
        httpx.Client(base_url=live_web, cookies=cookies, timeout=60) as page,
        httpx.Client(base_url=live_web, headers=bearer(raw), timeout=60) as script,
    ):
        events_url = submit(script, user)
        page_events, page_reader = follow(page, events_url)
        script_events, script_reader = follow(script, events_url)
        request = RequestFactory().get("/")
        request.session, request.user = SessionStore(session_key), user
        logout(request)  # as the logout view does: the signal, then the session flushed
        ended_by_login(page_events, page_reader)
        # The key still stands: its stream goes on to the answer's end.
        script_reader.join(timeout=120)
        assert script_events[-1]["event"] == "final"
