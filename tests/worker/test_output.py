"""The output writer: every answer's deltas on one clock, the first token at once, Stop and a
lost claim seen, and text that could not be written kept."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
import redis.asyncio as aioredis

from contract import protocol, transitions
from contract.protocol import Keys
from tests.worker.conftest import eventually
from worker.batching import CommandBatcher
from worker.output import OutputWriter


@pytest.fixture
async def make_writer(redis_prefix, counting):
    """Writers on the counting client, under this test's prefix; stopped afterwards."""
    made: list[tuple[OutputWriter, CommandBatcher]] = []

    def make(**options) -> OutputWriter:
        batcher = CommandBatcher(counting)  # type: ignore[arg-type]
        writer = OutputWriter(batcher, Keys(prefix=redis_prefix), **options)
        made.append((writer, batcher))
        return writer

    yield make
    for writer, batcher in made:
        await writer.stop()
        await batcher.close()


async def open_started(writer: OutputWriter, request_id: str, token: str = "t"):
    """A buffer for an attempt that owns its request, as the worker opens one."""
    await writer.batcher.call(
        lambda p: transitions.start(p, writer.keys, request_id, token=token, worker_id="w")
    )
    return writer.open(request_id, token)


async def deltas(client: aioredis.Redis, key: str) -> list[str]:
    return [f["text"] for _, f in await client.xrange(key) if f["type"] == protocol.EventType.DELTA]


async def test_many_answers_share_each_write_and_lose_no_text(make_writer, counting):
    writer = make_writer(interval=0.03, max_chars=10_000)
    rng = random.Random(7)

    async def generate(n: int) -> str:
        answer = await open_started(writer, f"r{n}")
        tokens = [f"t{n}.{i} " for i in range(40)]
        await asyncio.sleep(rng.random() * 0.05)  # the answers start at different times
        for token in tokens:
            await writer.add(answer, token)
            await asyncio.sleep(0.005)  # tokens come over time, as a model's do
        await writer.flush(answer)  # what is left, before the attempt's end
        await writer.close(answer)
        return "".join(tokens)

    texts = await asyncio.gather(*(generate(n) for n in range(30)))
    for n, text in enumerate(texts):
        written = await deltas(counting.client, writer.keys.output(f"r{n}"))
        assert "".join(written) == text
        assert written[0] == f"t{n}.0 "  # the first token alone, at once
        # 40 tokens over about 0.2 s on a 30 ms clock: a handful of entries, not 40.
        assert len(written) <= 15, len(written)
    # 1,200 tokens from 30 answers: a pipeline per tick and per first token, not per token
    # (and one per start, which the worker sends anyway).
    assert counting.pipelines <= 150, counting.pipelines


async def test_the_end_of_an_answer_comes_after_its_last_delta(make_writer, counting):
    writer = make_writer(interval=10)  # the clock never ticks here
    answer = await open_started(writer, "r1")
    for token in ("a", "b", "c"):
        await writer.add(answer, token)
    await writer.flush(answer)
    await writer.close(answer)
    out_key = writer.keys.output("r1")
    await writer.batcher.call(lambda p: p.xadd(out_key, {"type": protocol.EventType.FINAL}))
    entries = [f for _, f in await counting.client.xrange(out_key)]
    assert [(f["type"], f.get("text")) for f in entries if f["type"] != "start"] == [
        (protocol.EventType.DELTA, "a"),
        (protocol.EventType.DELTA, "bc"),
        (protocol.EventType.FINAL, None),
    ]
    assert "r1" not in writer.buffers


async def test_long_gathered_text_is_written_without_waiting_for_the_clock(make_writer, counting):
    writer = make_writer(interval=10, max_chars=8)
    answer = await open_started(writer, "r1")
    for token in ("first", "1234", "5678", "x"):
        await writer.add(answer, token)
    assert await deltas(counting.client, writer.keys.output("r1")) == ["first", "12345678"]
    assert answer.pending == ["x"]


async def test_a_stop_is_seen_on_the_clock_for_that_answer_only(make_writer, counting):
    writer = make_writer(interval=0.01, check_interval=0.05)
    stopped = await open_started(writer, "stopped")
    running = await open_started(writer, "running")
    await counting.client.set(writer.keys.cancel("stopped"), "1")
    await eventually(lambda: stopped.cancelled, what="the stop to be seen", every=0.01)
    assert not running.cancelled
    assert not running.lost


async def test_an_attempt_replaced_by_another_learns_it_and_writes_no_more(make_writer, counting):
    writer = make_writer(interval=0.01, check_interval=0.05)
    old = await open_started(writer, "r1", token="old")
    await writer.add(old, "tok0 ")
    await writer.batcher.call(
        lambda p: transitions.start(p, writer.keys, "r1", token="new", worker_id="w2")
    )
    # The owner check on the clock notices, even without new text.
    await eventually(lambda: old.lost, what="the lost claim to be seen", every=0.01)
    assert old.over
    await writer.add(old, "tok1 ")
    await writer.flush(old)
    assert await deltas(counting.client, writer.keys.output("r1")) == ["tok0 "]


async def test_text_that_could_not_be_written_is_kept_and_sent_once(make_writer, counting):
    writer = make_writer(interval=10)
    answer = await open_started(writer, "r1")
    await writer.add(answer, "a")  # the first token, written at once
    await writer.add(answer, "x")
    batch, text, logprobs = answer.take()  # taken for a write whose reply never came...
    assert logprobs is None  # the request asks for none
    answer.pending.append("b")
    answer.put_back(batch, text, logprobs)  # ...so it goes back in front of what arrived since
    await writer.flush(answer)
    await writer.flush(answer)  # nothing left: writes nothing
    assert await deltas(counting.client, writer.keys.output("r1")) == ["a", "xb"]


def scored(token: str) -> dict:
    return {"token": token, "logprob": -0.5, "bytes": list(token.encode()), "top_logprobs": []}


async def test_log_probabilities_ride_with_their_text_and_only_when_asked(make_writer, counting):
    writer = make_writer(interval=10)
    plain = await open_started(writer, "plain")
    await writer.add(plain, "Hi")
    asked = await open_started(writer, "asked")
    await writer.add(asked, "Hel", [scored("Hel")])  # the first token, written at once
    await writer.add(asked, "lo", [scored("lo")])
    batch, text, logprobs = asked.take()  # a write whose reply never came: kept, in order
    await writer.add(asked, "!", [scored("!")])
    asked.put_back(batch, text, logprobs)
    await writer.flush(asked)
    entries = [f for _, f in await counting.client.xrange(writer.keys.output("asked"))]
    written = [f for f in entries if f["type"] == protocol.EventType.DELTA]
    assert [f["text"] for f in written] == ["Hel", "lo!"]
    assert [[e["token"] for e in json.loads(f["logprobs"])] for f in written] == [
        ["Hel"],
        ["lo", "!"],
    ]
    # A request that does not ask writes the entry it always did.
    (delta,) = [f for _, f in await counting.client.xrange(writer.keys.output("plain"))][-1:]
    assert set(delta) == {"type", "text"}


async def test_a_stop_is_seen_in_the_reply_to_the_answers_next_delta(make_writer, counting):
    writer = make_writer(interval=0.01, check_interval=3600)  # no separate check in this test
    stopped = await open_started(writer, "stopped")
    running = await open_started(writer, "running")
    for answer in (stopped, running):
        await writer.add(answer, "first ")
    await counting.client.set(writer.keys.cancel("stopped"), "1")

    async def generating() -> bool:
        """A token more for each answer, as the model goes on; whether the stop was seen."""
        for answer in (stopped, running):
            await writer.add(answer, "more ")
        return stopped.cancelled

    await eventually(generating, what="the stop in a delta's reply", every=0.01)
    assert not stopped.lost
    assert not running.cancelled and not running.lost
    # The text written with the reply is kept: Stop ends the answer after what was generated.
    assert "more " in await deltas(counting.client, writer.keys.output("stopped"))


async def test_the_clock_slows_in_step_with_the_answers_running(make_writer):
    writer = make_writer(interval=0.05, busy_interval=0.15, busy_answers=5)
    assert writer.interval_now() == pytest.approx(0.05)
    for n in range(3):
        writer.open(f"r{n}", "t")
    assert writer.interval_now() == pytest.approx(0.1)  # 3 of 5: half way
    for n in range(3, 9):
        writer.open(f"r{n}", "t")
    assert writer.interval_now() == pytest.approx(0.15)  # busy: no slower than this
    assert make_writer(interval=0.05).interval_now() == pytest.approx(0.05)  # not asked for
