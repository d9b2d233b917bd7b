"""One Redis client per process (a connection pool), and the key prefix every key carries."""

from __future__ import annotations

import functools
import os

import redis
import redis.asyncio
from django.conf import settings


@functools.cache
def get_redis() -> redis.Redis:
    # Named, so CLIENT LIST shows which process holds which connections.
    return redis.Redis.from_url(
        settings.REDIS_URL, decode_responses=True, client_name=f"sluice-{os.getpid()}"
    )


def key(*parts: str) -> str:
    return ":".join([settings.SLUICE_REDIS_PREFIX, *parts])
