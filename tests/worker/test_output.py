"""The output writer: every answer's deltas on one clock, the first token at once, Stop seen."""

from __future__ import annotations

import asyncio
import random

import redis.asyncio as aioredis
from django.conf import settings

from worker import protocol
from worker.batching import CommandBatcher
from worker.output import OutputWriter
from worker.protocol import Keys


class CountingClient:
    """A real asyncio Redis client that counts the pipelines sent through it."""

    def __init__(self) -> None:
        self.client = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
        self.pipelines = 0

    def pipeline(self, **options):
        self.pipelines += 1
        return self.client.pipeline(**options)


async def deltas(client: aioredis.Redis, key: str) -> list[str]:
    return [f["text"] for _, f in await client.xrange(key) if f["type"] == protocol.EventType.DELTA]


async def test_many_answers_share_each_write_and_lose_no_text(redis_prefix):
    counting = CountingClient()
    keys = Keys(prefix=redis_prefix)
    batcher = CommandBatcher(counting)  # type: ignore[arg-type]
    writer = OutputWriter(batcher, keys, interval=0.03, max_chars=10_000)
    rng = random.Random(7)

    async def generate(n: int) -> str:
        answer = writer.open(f"r{n}")
        tokens = [f"t{n}.{i} " for i in range(40)]
        await asyncio.sleep(rng.random() * 0.05)
        for token in tokens:
            await writer.add(answer, token)
            await asyncio.sleep(0.005)
        await writer.close(answer)
        return "".join(tokens)

    texts = await asyncio.gather(*(generate(n) for n in range(30)))
    for n, text in enumerate(texts):
        written = await deltas(counting.client, keys.output(f"r{n}"))
        assert "".join(written) == text
        assert written[0] == f"t{n}.0 "  # the first token alone, at once
        # 40 tokens over about 0.2 s on a 30 ms clock: a handful of entries, not 40.
        assert len(written) <= 15, len(written)
    # 1,200 tokens from 30 answers: a pipeline per tick and per first token, not per token.
    assert counting.pipelines <= 120, counting.pipelines
    await writer.stop()
    await batcher.close()
    await counting.client.aclose()


async def test_the_end_of_an_answer_comes_after_its_last_delta(redis_prefix):
    client = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    keys = Keys(prefix=redis_prefix)
    batcher = CommandBatcher(client)
    writer = OutputWriter(batcher, keys, interval=10)  # the clock never ticks here
    answer = writer.open("r1")
    for token in ("a", "b", "c"):
        await writer.add(answer, token)
    await writer.close(answer)
    await batcher.call(lambda p: p.xadd(answer.out_key, {"type": protocol.EventType.FINAL}))
    entries = [f for _, f in await client.xrange(answer.out_key)]
    assert [(f["type"], f.get("text")) for f in entries] == [
        (protocol.EventType.DELTA, "a"), (protocol.EventType.DELTA, "bc"),
        (protocol.EventType.FINAL, None),
    ]  # fmt: skip
    assert "r1" not in writer.answers
    await writer.stop()
    await batcher.close()
    await client.aclose()


async def test_long_gathered_text_is_written_without_waiting_for_the_clock(redis_prefix):
    client = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    keys = Keys(prefix=redis_prefix)
    batcher = CommandBatcher(client)
    writer = OutputWriter(batcher, keys, interval=10, max_chars=8)
    answer = writer.open("r1")
    for token in ("first", "1234", "5678", "x"):
        await writer.add(answer, token)
    assert await deltas(client, answer.out_key) == ["first", "12345678"]
    assert answer.pending == ["x"]
    await writer.stop()
    await batcher.close()
    await client.aclose()


async def test_a_stop_is_seen_on_the_clock_for_that_answer_only(redis_prefix):
    client = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    keys = Keys(prefix=redis_prefix)
    batcher = CommandBatcher(client)
    writer = OutputWriter(batcher, keys, interval=0.01, cancel_interval=0.05)
    stopped, running = writer.open("stopped"), writer.open("running")
    await client.set(keys.cancel("stopped"), "1")
    for _ in range(100):
        if stopped.cancelled:
            break
        await asyncio.sleep(0.01)
    assert stopped.cancelled
    assert not running.cancelled
    await writer.stop()
    await batcher.close()
    await client.aclose()
