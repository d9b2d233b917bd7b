"""What the worker's tests share: a real asyncio Redis client that counts its pipelines."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from django.conf import settings


class CountingClient:
    """A real asyncio Redis client that counts the pipelines sent through it."""

    def __init__(self) -> None:
        self.client = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
        self.pipelines = 0

    def pipeline(self, **options):
        self.pipelines += 1
        return self.client.pipeline(**options)


@pytest.fixture
async def counting():
    counting = CountingClient()
    yield counting
    await counting.client.aclose()
