"""The multiplexed reader: many readers, two Redis connections, nothing missed or repeated."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from django.conf import settings

from apps.streams.hub import OutputHub
from contract.cancelling import cancel_and_wait
from tests.chat.conftest import wait_for


async def collect(hub: OutputHub, stream: str, after: str = "0") -> list[str]:
    return [fields["text"] async for _, fields in hub.events(stream, after=after)]


async def connections_named(client, name: str, *, at_least: int, timeout: float = 15) -> list:
    """The Redis connections whose name starts with `name`, once there are `at_least` of them:
    the hub connects when its first reader asks, which takes a while on a loaded machine."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        named = [c for c in await client.client_list() if c["name"].startswith(name)]
        if len(named) >= at_least or loop.time() > deadline:
            return named
        await asyncio.sleep(0.05)


async def close_hub(hub: OutputHub) -> None:
    """Ends a test's hub within its loop (a process's hub lives as long as the process)."""
    for task in (hub._task, hub._unblocking):
        if task is not None:
            await cancel_and_wait(task)
    for client in (hub._reader, hub._control):
        if client is not None:
            await client.aclose()


async def test_many_readers_share_two_connections_and_see_every_entry(redis_prefix):
    client = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    name = f"hub-test-{redis_prefix}"
    hub = OutputHub(settings.REDIS_URL, name=name)
    streams = [f"{redis_prefix}:out:{{{i}}}" for i in range(60)]
    # Some text exists before the readers come (a refresh mid-answer), some arrives after.
    for stream in streams:
        await client.xadd(stream, {"type": "delta", "text": "a"})
    readers = [asyncio.create_task(collect(hub, s)) for s in streams]
    hub_clients = await connections_named(client, name, at_least=2)
    for stream in streams:
        await client.xadd(stream, {"type": "delta", "text": "b"})
        await client.xadd(stream, {"type": "final", "text": "c"})
    results = await asyncio.wait_for(asyncio.gather(*readers), timeout=10)
    assert all(r == ["a", "b", "c"] for r in results)
    # The reader plus one or two control connections, not one connection per reader.
    assert 2 <= len(hub_clients) <= 1 + 2, hub_clients
    await close_hub(hub)
    await client.aclose()


async def test_resuming_after_an_event_id_skips_what_was_seen(redis_prefix):
    client = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    stream = f"{redis_prefix}:out:{{r}}"
    ids = [await client.xadd(stream, {"type": "delta", "text": t}) for t in "xyz"]
    await client.xadd(stream, {"type": "final", "text": "!"})
    hub = OutputHub(settings.REDIS_URL)
    assert await collect(hub, stream, after=ids[1]) == ["z", "!"]
    await close_hub(hub)
    await client.aclose()


def test_the_pre_encoded_xread_is_what_redis_py_would_send():
    from redis.connection import Connection

    from apps.streams.hub import XreadPacker

    streams = {f"sluice:out:{{{i:032x}}}": f"1764430000000-{i}" for i in range(30)}
    streams["sluice:out:{é}"] = "0"  # a name beyond ASCII keeps its byte length right
    packer = XreadPacker(count=500)
    expected = b"".join(
        Connection().pack_command(
            "XREAD", "COUNT", 500, "BLOCK", 5000, "STREAMS", *streams, *streams.values()
        )
    )
    assert packer.xread(streams, block=5000) == expected
    assert packer.xread(streams, block=5000) == expected  # from the cache of encoded names


def test_the_pause_between_busy_reads_grows_with_the_streams_up_to_a_bound():
    from apps.streams.hub import BUSY_STREAMS, PAUSE_MOST_SECONDS, busy_pause

    assert busy_pause(1) == busy_pause(BUSY_STREAMS - 1) == 0.0  # few chats: read at once
    assert 0 < busy_pause(BUSY_STREAMS) < busy_pause(50) < busy_pause(100)
    assert abs(busy_pause(100) - 0.010) < 1e-9  # a hundred chats: 10 ms
    assert busy_pause(10_000) == PAUSE_MOST_SECONDS


async def test_a_reader_given_the_entry_it_wrote_misses_nothing_without_a_catch_up_read(
    redis_prefix,
):
    """A request's publisher follows its answer from the first event it wrote: entries written
    after it, even before the reader came, all arrive, with no catch-up read. A second reader
    of a stream already followed (another tab) catches up as usual."""
    client = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    stream = f"{redis_prefix}:out:{{w}}"
    first = await client.xadd(stream, {"type": "status", "text": "queued"})
    await client.xadd(stream, {"type": "delta", "text": "a"})  # before anyone reads
    hub = OutputHub(settings.REDIS_URL)

    async def xrange_calls() -> int:  # a catch-up read is one XRANGE, as Redis counts them
        stats = await client.info("commandstats")
        return int(stats.get("cmdstat_xrange", {}).get("calls", 0))

    written = (first, {"type": "status", "text": "queued"})
    before = await xrange_calls()

    async def read(texts: list[str]) -> list[str]:
        async for batch in hub.batches(stream, written=written):
            texts.extend(fields["text"] for _, fields in batch)
        return texts

    publisher_saw: list[str] = []
    publisher = asyncio.create_task(read(publisher_saw))
    # Once it has the entry written before it came, it is past where it would have caught up.
    await wait_for(lambda: "a" in publisher_saw, what="the publisher to read the first delta")
    assert await xrange_calls() == before  # the publisher follows without catching up
    tab_saw: list[str] = []
    other_tab = asyncio.create_task(read(tab_saw))
    await wait_for(lambda: "a" in tab_saw, what="the other tab to catch up")
    await client.xadd(stream, {"type": "final", "text": "b"})
    texts = await asyncio.wait_for(asyncio.gather(publisher, other_tab), timeout=10)
    assert texts == [["queued", "a", "b"], ["queued", "a", "b"]]
    assert await xrange_calls() == before + 1  # the other tab's catch-up only
    await close_hub(hub)
    await client.aclose()


async def test_a_hub_stopped_as_its_reader_connects_ends(redis_prefix):
    """Its reader's connect writes through `asyncio.wait_for`, which on Python 3.11 can swallow
    the cancel that arrives as a write completes: the reader then went on to wait for
    subscribers forever, and so did whoever stopped it (an event loop's close, for one)."""
    client = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    stream = f"{redis_prefix}:out:{{c}}"
    first = await client.xadd(stream, {"type": "delta", "text": "x"})
    await client.xadd(stream, {"type": "final", "text": "!"})
    for _ in range(20):  # the cancel lands at a different point of the connect each time
        hub = OutputHub(settings.REDIS_URL)
        assert await collect(hub, stream, after=first) == ["!"]
        await asyncio.wait_for(close_hub(hub), timeout=10)
    await client.aclose()
