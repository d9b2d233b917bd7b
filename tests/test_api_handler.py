"""The API's own Django handler: its requests share one thread for Django's request signals,
where Django would start (and stop) two threads for every request."""

from __future__ import annotations

import asyncio
import json
import threading

from chatsite.api_handler import ApiHandler


async def get(app, path: str) -> tuple[int, dict]:
    """One GET through the ASGI app: its status and JSON body."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "headers": [(b"host", b"testserver")],
             "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}  # fmt: skip
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
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body)


def test_api_requests_start_no_thread_of_their_own(monkeypatch):
    started = []
    real_start = threading.Thread.start

    def counted(thread):
        started.append(thread.name)
        return real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", counted)
    app = ApiHandler()

    async def requests():
        first = await get(app, "/v1/models")  # starts what lives on: the shared thread
        warm = len(started)
        more = [await get(app, "/v1/models") for _ in range(5)]
        return [first, *more], started[warm:]

    replies, per_request = asyncio.run(requests())
    assert [status for status, _ in replies] == [401] * 6  # no key: OpenAI's error shape
    assert all(body["error"]["code"] == "invalid_api_key" for _, body in replies)
    assert per_request == []  # Django's own handler: two threads a request
    app.signals_thread.shutdown()
