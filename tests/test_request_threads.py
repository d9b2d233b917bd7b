"""Django's HTTP requests without a thread started per request: the API's requests share one
thread for Django's request signals; a page request gets a thread of its own for as long as it
runs, reused by later requests. Django alone starts (and stops) two threads for every request."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from asgiref.sync import sync_to_async
from django.core.asgi import get_asgi_application

from apps.api.handler import ApiHandler
from core.request_threads import ReusedThreads, with_reused_threads


async def get(app, path: str) -> tuple[int, bytes]:
    """One GET through the ASGI app: its status and body."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    sent: list[dict] = []
    requested = False

    async def receive():
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client never disconnects

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


@pytest.fixture
def started(monkeypatch) -> list[str]:
    """The names of the threads started from now on."""
    names: list[str] = []
    real_start = threading.Thread.start

    def counted(thread):
        names.append(thread.name)
        return real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", counted)
    return names


def test_api_requests_start_no_thread_of_their_own(started):
    app = ApiHandler()

    async def requests():
        first = await get(app, "/v1/models")  # starts what lives on: the shared thread
        warm = len(started)
        more = [await get(app, "/v1/models") for _ in range(5)]
        return [first, *more], started[warm:]

    replies, started_later = asyncio.run(requests())
    assert [status for status, _ in replies] == [401] * 6  # no key: OpenAI's error shape
    assert all(json.loads(body)["error"]["code"] == "invalid_api_key" for _, body in replies)
    # Django logs a 4xx through the loop's shared default executor (`thread_sensitive=False`),
    # a pool that starts a thread only when none of its own is idle: on a busy machine its
    # first thread may still be finishing the previous log line. Its threads are not per request.
    per_request = [name for name in started_later if not name.startswith("asyncio_")]
    assert per_request == []  # Django's own handler: two threads a request
    app.signals_thread.shutdown()


@pytest.mark.django_db
def test_page_requests_reuse_the_threads_of_finished_ones(started):
    app = with_reused_threads(get_asgi_application(), ReusedThreads())

    async def requests():
        first = await get(app, "/accounts/login/")  # starts the thread later requests reuse
        warm = len(started)
        more = [await get(app, "/accounts/login/") for _ in range(5)]
        return [first, *more], started[warm:]

    replies, per_request = asyncio.run(requests())
    assert [status for status, _ in replies] == [200] * 6
    assert all(b"Sign in" in body or b"password" in body for _, body in replies)
    assert per_request == []  # Django alone: two threads a request


def test_requests_at_once_each_have_a_thread_and_later_ones_reuse_them():
    threads = ReusedThreads(keep=1)
    # The two requests at once each wait in their view for the other to be in its view too:
    # on a shared thread neither could, and the barrier breaks after its timeout.
    at_once = threading.Barrier(2, timeout=10)

    def view(meet: threading.Barrier | None) -> int:
        if meet is not None:
            meet.wait()
        return threading.get_ident()

    async def request(meet: threading.Barrier | None = None) -> int:
        async with threads.context():  # as Django runs a sync view: on the context's thread
            return await sync_to_async(view)(meet)

    async def scenario():
        together = await asyncio.gather(request(at_once), request(at_once))
        later = await request()
        return together, later

    together, later = asyncio.run(scenario())
    assert together[0] != together[1]  # isolated: neither waited for the other's thread
    assert later in together  # one was kept (keep=1) and lent again
