"""One Redis client per process (a bounded connection pool), and the names of every key."""

from __future__ import annotations

import functools
import os

import redis
from django.conf import settings

from worker.protocol import Keys


@functools.cache
def get_redis() -> redis.Redis:
    # A small blocking pool: Redis connections per process stay fixed however many requests
    # run at once (callers wait for a free connection). Timeouts: a frozen or unreachable Redis
    # fails a command within seconds instead of hanging the request that sent it. Named, so
    # CLIENT LIST shows who is who.
    pool = redis.BlockingConnectionPool.from_url(
        settings.REDIS_URL,
        decode_responses=True,
        max_connections=settings.REDIS_POOL_SIZE,
        timeout=settings.REDIS_SOCKET_TIMEOUT,
        socket_timeout=settings.REDIS_SOCKET_TIMEOUT,
        socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT,
        client_name=f"sluice-{os.getpid()}",
    )
    return redis.Redis(connection_pool=pool)


def keys() -> Keys:
    """Redis names under this deployment's (or this test's) prefix."""
    return Keys(prefix=settings.SLUICE_REDIS_PREFIX)
