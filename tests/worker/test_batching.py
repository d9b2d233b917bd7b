"""The worker's command batcher: many callers, few pipelines, each caller its own reply."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError

from worker import redis_connection
from worker.batching import CommandBatcher


async def test_concurrent_callers_share_pipelines_and_keep_their_order(redis_prefix, counting):
    batcher = CommandBatcher(counting)  # type: ignore[arg-type]
    streams = [f"{redis_prefix}:out:{{{i}}}" for i in range(50)]

    async def writer(stream: str) -> list[str]:
        return [await batcher.call(lambda p, n=n: p.xadd(stream, {"n": str(n)})) for n in range(20)]

    ids = await asyncio.gather(*(writer(s) for s in streams))
    assert all(len(set(i)) == 20 for i in ids)  # each caller got its own entry ids
    for stream in streams:
        entries = await counting.client.xrange(stream)
        assert [int(f["n"]) for _, f in entries] == list(range(20))
    # 1,000 commands from 50 concurrent writers went in far fewer pipelines.
    assert counting.pipelines <= 1000 // 5, counting.pipelines
    await batcher.close()


async def test_several_commands_in_one_call_return_their_replies_in_order(redis_prefix):
    client = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    batcher = CommandBatcher(client)
    key = f"{redis_prefix}:k"
    assert await batcher.call(lambda p: (p.set(key, "1"), p.incr(key), p.get(key))) == [
        True,
        2,
        "2",
    ]
    assert await batcher.call(lambda p: p.exists(key)) == 1
    await batcher.close()
    await client.aclose()


async def test_an_error_fails_only_its_own_caller(redis_prefix):
    client = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    batcher = CommandBatcher(client)
    text, counter = f"{redis_prefix}:text", f"{redis_prefix}:n"
    await client.set(text, "not a number")

    results = await asyncio.gather(
        batcher.call(lambda p: p.incr(text)),  # a Redis error
        batcher.call(lambda p: p.incr(counter)),
        batcher.call(lambda p: p.hset(text)),  # redis-py refuses the arguments
        batcher.call(lambda p: p.incr(counter)),
        return_exceptions=True,
    )
    assert isinstance(results[0], ResponseError)
    assert isinstance(results[2], DataError)
    assert results[1] == 1 and results[3] == 2
    await batcher.close()
    await client.aclose()


async def test_a_lost_connection_fails_every_waiting_caller():
    client = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    batcher = CommandBatcher(client)
    with pytest.raises(RedisConnectionError):
        await asyncio.wait_for(batcher.call(lambda p: p.get("x")), timeout=10)
    await batcher.close()


async def test_sent_is_called_once_its_commands_are_written_and_before_their_reply(redis_prefix):
    client = redis_connection.connect(settings.REDIS_URL, decode_responses=True)
    batcher = CommandBatcher(client)
    key = f"{redis_prefix}:sent"
    calls = []
    pending = asyncio.ensure_future(
        batcher.call(lambda p: p.incr(key), sent=lambda: calls.append(pending.done()))
    )
    assert await pending == 1
    assert calls == [False]  # once, while the reply was still to come
    # On a plain redis-py connection (as a cluster's or TLS client) nobody reports the write.
    plain = CommandBatcher(aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True))
    assert await plain.call(lambda p: p.incr(key), sent=lambda: calls.append("plain")) == 2
    assert calls == [False]
    await batcher.close()
    await plain.close()
    await client.aclose()
    await plain.client.aclose()
