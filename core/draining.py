"""A web process that is told to stop (SIGTERM) finishes what it is serving before it exits.

An upgrade replaces web processes one at a time. Killed at once, a web process would cut every
answer it is streaming to an API client that cannot resume (the OpenAI API's streams, a waiting
non-streamed call), and the request would be cancelled with its client gone. Draining instead:

- new HTTP requests (health checks included) get 503 with `Retry-After`, so a load balancer
  takes the process out and clients go to another one;
- requests already in flight (streams included) run to their end, for at most
  `SLUICE_WEB_DRAIN_SECONDS`;
- then the server stops; open websockets close with it, and the page reconnects to another web
  process and resumes its answer from the last event it saw (as after a crash).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time

log = logging.getLogger("sluice.web")

DRAIN_POLL_SECONDS = 0.2


class Draining:
    """ASGI wrapper: counts the HTTP requests in flight and, once draining, refuses new ones."""

    def __init__(self, app) -> None:
        self.app = app
        self.in_flight = 0
        self.draining = False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.draining:
            return await _refuse(send)
        self.in_flight += 1
        try:
            return await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


async def _refuse(send) -> None:
    body = json.dumps({"error": "This server is restarting; try again.", "code": "restarting"})
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"retry-after", b"1"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body.encode()})


def drain_on_sigterm(draining: Draining, *, seconds: float | None = None) -> None:
    """Once daphne's reactor runs, SIGTERM drains `draining` and then stops the reactor (a
    second SIGTERM, or SIGINT, stops at once as before)."""
    from twisted.internet import reactor

    limit = seconds if seconds is not None else _drain_seconds()

    def stop_when_drained(deadline: float) -> None:
        if draining.in_flight and time.monotonic() < deadline:
            reactor.callLater(DRAIN_POLL_SECONDS, stop_when_drained, deadline)
            return
        if draining.in_flight:
            log.warning("stopping with %d requests still in flight", draining.in_flight)
        reactor.stop()

    def on_sigterm(signum, frame) -> None:
        if draining.draining:
            reactor.callFromThread(reactor.stop)
            return
        draining.draining = True
        log.info("draining: %d requests in flight, up to %.0f s", draining.in_flight, limit)
        reactor.callFromThread(stop_when_drained, time.monotonic() + limit)

    # After the reactor's own handlers are installed, so this one is the one that stays.
    reactor.callWhenRunning(signal.signal, signal.SIGTERM, on_sigterm)


def _drain_seconds() -> float:
    return float(os.environ.get("SLUICE_WEB_DRAIN_SECONDS", "30"))
