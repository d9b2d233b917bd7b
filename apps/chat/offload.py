"""Database work called from async code (the websocket consumer), run concurrently.

Channels' `database_sync_to_async` runs every call in one shared thread (asgiref's
thread-sensitive mode): a web process would then store and submit one message at a time while
every other chat waited in line behind it. These calls need no particular thread, so they run in
a small pool instead; each pool thread keeps its own persistent database connection.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from channels.db import DatabaseSyncToAsync
from django.conf import settings

_pool: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(
            max_workers=settings.WEB_DB_THREADS, thread_name_prefix="sluice-db"
        )
    return _pool


def db_call(func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` as an awaitable run in the pool, with stale connections closed around it."""
    return DatabaseSyncToAsync(func, thread_sensitive=False, executor=_executor())
