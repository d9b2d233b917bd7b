"""Database work called from async code (the websocket consumer), run concurrently.

Channels' `database_sync_to_async` runs every call in one shared thread (asgiref's
thread-sensitive mode): a web process would then store and submit one message at a time while
every other chat waited in line behind it. These calls need no particular thread, so they run in
a small pool instead; each pool thread keeps its own database connection. In a web process that
connection is borrowed from the bounded connection pool once and kept, rather than borrowed
(and checked by the pool) for every frame: WEB_DB_THREADS of the pool's connections serve the
websockets, the rest the HTTP requests.

Measured on and off (bench/ab.py, the reconnect bench: 300 pages' two sockets opened at once;
"before" is the release whose logins, frames and closes ran through Channels' own helpers):
`bench/ab.py 2285c36 reconnect --pairs 2 -- --pages 300 --rounds 2`: all open in 4044 -> 3477
ms, handshake p50 3130 -> 2036 ms, web CPU 5.83 -> 5.22 ms per socket (-10 %), lower in every
pair; with the plain-statement login, `bench/ab.py 6ae5ffb reconnect --pairs 2 -- --pages 300
--rounds 2`: 6.81 -> 5.12 ms per socket, 12 -> 0 sockets dropped. Kept for that; it relies on
Channels 4.3's consumer and middleware behaviour (pyproject pins channels to 4.3.x).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import SyncToAsync
from django.conf import settings
from django.db import connections

# A connection that passed Django's health check (CONN_HEALTH_CHECKS) this recently is not
# checked again: a chat frame is one small call, and a `SELECT 1` before each would be one
# round trip in every few. A connection that saw an error is still checked at once.
HEALTH_CHECK_SECONDS = 1.0

# The lanes' threads: `frames` for the sockets' frames (WEB_DB_THREADS of them), `logins` (one)
# for their logins, so that a crowd of sockets opening at once never holds up the frames of
# the chats already open.
LOGINS = "logins"
_pools: dict[str, ThreadPoolExecutor] = {}
_thread_connections: list = []  # each pool thread's connection wrappers, closed at shutdown


def _executor(lane: str = "frames") -> ThreadPoolExecutor:
    if lane not in _pools:
        _pools[lane] = ThreadPoolExecutor(
            max_workers=1 if lane == LOGINS else settings.WEB_DB_THREADS,
            thread_name_prefix=f"sluice-db-{lane}",
            initializer=lambda: _thread_connections.extend(connections.all()),
        )
    return _pools[lane]


def shutdown() -> None:
    """Stops the pools and closes their threads' database connections."""
    while _pools:
        _pools.popitem()[1].shutdown(wait=True)
    for conn in _thread_connections:
        if conn.connection is not None:  # its thread has ended: nothing else uses it
            conn.connection.close()
    _thread_connections.clear()


def tidy_connections(now: float | None = None) -> None:
    """Django's `close_old_connections` (drops a connection past its age, or broken after an
    error), keeping a health check younger than HEALTH_CHECK_SECONDS."""
    now = time.monotonic() if now is None else now
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and getattr(conn, "pool", None) is not None:
            conn.close_at = None  # kept by this thread; dropped only when broken (below)
        if not conn.health_check_done:
            conn.sluice_checked_at = None  # not checked since it was last cleared
        elif getattr(conn, "sluice_checked_at", None) is None:
            conn.sluice_checked_at = now  # checked, or connected, during the call just made
        checked = conn.sluice_checked_at
        recent = checked is not None and now - checked < HEALTH_CHECK_SECONDS
        conn.close_if_unusable_or_obsolete()  # clears health_check_done
        if recent and conn.connection is not None:
            conn.health_check_done = True
        else:
            conn.sluice_checked_at = None


class PooledDatabaseCall(SyncToAsync):
    """A sync function as an awaitable run in the pool, connections tidied around it."""

    def thread_handler(self, loop, *args, **kwargs):
        tidy_connections()
        try:
            return super().thread_handler(loop, *args, **kwargs)
        finally:
            tidy_connections()


def db_call(func: Callable[..., Any], *, lane: str = "frames") -> Callable[..., Any]:
    """`func` as an awaitable run in the pool's `lane`."""
    return PooledDatabaseCall(func, thread_sensitive=False, executor=_executor(lane))
