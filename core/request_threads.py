"""Threads for Django's per-request synchronous work, kept from one request to the next.

Under ASGI, Django runs each HTTP request's synchronous code (sync views, classic middleware
steps, the request signals) on a thread of the request's own: every request enters a
thread-sensitive context whose executor starts a new thread, and when the request ends a
second thread is started to shut that one down. So every page, admin or `/api/v1/` request
starts and stops two threads. `ReusedThreads` keeps the isolation (each thread serves one request
at a time) and hands a finished request's thread to the next one, so a web process starts
threads only when more requests run at once than ever before.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext


class ReusedThreads:
    """Single-thread executors lent to one request at a time. Up to `keep` idle ones are kept
    for the next requests; the rest are shut down as their requests end."""

    def __init__(self, *, keep: int = 16, name: str = "sluice-request") -> None:
        self.keep = keep
        self.name = name
        self._idle: list[ThreadPoolExecutor] = []

    @contextlib.asynccontextmanager
    async def context(self) -> AsyncIterator[None]:
        """The request's thread-sensitive context, on a thread of its own for as long as it
        runs. Entered before Django's own, which then uses it instead of starting a thread."""
        executor = (
            self._idle.pop()
            if self._idle
            else ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        )
        try:
            async with ThreadSensitiveContext(executor=executor):
                yield
        finally:
            # A request cancelled mid-way may leave its sync code running: the next request
            # lent this thread then waits for it, as it would on a busy machine.
            if len(self._idle) < self.keep:
                self._idle.append(executor)
            else:
                executor.shutdown(wait=False)


def with_reused_threads(app, threads: ReusedThreads):
    """The ASGI `app` (Django's handler) with each HTTP request in a context of `threads`."""

    async def wrapped(scope, receive, send):
        async with threads.context():
            await app(scope, receive, send)

    return wrapped
