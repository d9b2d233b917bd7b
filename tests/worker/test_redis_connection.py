"""The worker's Redis connection: hiredis-packed commands, and replies already arrived read
without arming a timeout for each; a reply still to come is read under the socket timeout."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio.connection as aioredis_connection
from django.conf import settings
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker import redis_connection


@pytest.fixture
def timeouts_armed(monkeypatch) -> list[float]:
    """The read timeouts redis-py arms, as it arms them."""
    armed: list[float] = []
    real = aioredis_connection.async_timeout

    def counted(delay):
        armed.append(delay)
        return real(delay)

    monkeypatch.setattr(aioredis_connection, "async_timeout", counted)
    return armed


async def test_a_pipelines_replies_need_no_timeout_each_and_keep_their_errors(
    redis_prefix, timeouts_armed
):
    client = redis_connection.connect(settings.REDIS_URL, decode_responses=True)
    key = f"{redis_prefix}:n"
    await client.ping()  # connected: the handshake's own reads are not counted
    timeouts_armed.clear()
    pipe = client.pipeline(transaction=False)
    for _ in range(50):
        pipe.incr(key)
    pipe.hget(key, "field")  # a wrong-type error among the replies
    pipe.evalsha("0" * 40, 0)  # a script Redis does not know
    pipe.get(key)
    replies = await pipe.execute(raise_on_error=False)
    assert replies[:50] == list(range(1, 51))
    assert isinstance(replies[50], ResponseError) and "WRONGTYPE" in str(replies[50])
    assert isinstance(replies[51], NoScriptError)  # the same exception class as redis-py's
    assert replies[52] == "50"
    assert len(timeouts_armed) < 10  # redis-py alone: one per reply, 53
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await client.hget(key, "field")
    await client.aclose()


async def test_a_reply_that_does_not_come_still_times_out(redis_prefix):
    client = redis_connection.connect(settings.REDIS_URL, socket_timeout=0.5)
    started = time.monotonic()
    # BLPOP's own timeout 0 blocks for ever: Redis never answers, so only the socket timeout
    # can end the read (with a finite one, a machine that stalls for longer than it could see
    # Redis's empty reply arrive first).
    with pytest.raises(RedisTimeoutError):
        await asyncio.wait_for(client.blpop([f"{redis_prefix}:never"], timeout=0), timeout=10)
    assert time.monotonic() - started < 4  # the socket timeout ended it, not the guard's 10 s
    assert await client.ping()  # the pool gives a fresh connection afterwards
    await client.aclose()
