"""One Redis client per process (a connection pool), and the key prefix every key carries."""

from __future__ import annotations

import functools
import os

import redis
import redis.asyncio
from django.conf import settings


@functools.cache
def get_redis() -> redis.Redis:
    # A small blocking pool: Redis connections per process stay fixed however many requests
    # run at once (callers wait for a free connection). Named, so CLIENT LIST shows who is who.
    pool = redis.BlockingConnectionPool.from_url(
        settings.REDIS_URL,
        decode_responses=True,
        max_connections=settings.REDIS_POOL_SIZE,
        timeout=20,
        client_name=f"sluice-{os.getpid()}",
    )
    return redis.Redis(connection_pool=pool)


def key(*parts: str) -> str:
    return ":".join([settings.SLUICE_REDIS_PREFIX, *parts])
