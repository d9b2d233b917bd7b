"""The output hub on a cluster: a listener per node, constant connections, nothing missed."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings

from apps.streams.cluster_hub import ClusterOutputHub
from apps.streams.hub import get_hub
from contract import cluster
from core.redis_client import get_redis


async def collect(hub, stream: str, after: str = "0") -> list[str]:
    return [fields["text"] async for _, fields in hub.events(stream, after=after)]


async def hub_connections_per_node(client, name: str) -> Counter:
    counts = Counter()
    for node in client.get_primaries():
        listed = await client.client_list(target_nodes=node)
        counts[node.name] = sum(1 for c in listed if c["name"].startswith(name))
    return counts


async def test_readers_on_every_node_share_a_few_connections_per_node(redis_prefix):
    client = cluster.async_client(
        settings.REDIS_URL, decode_responses=True, socket_timeout=5, connect_timeout=2
    )
    name = f"hub-test-{redis_prefix}"
    hub = ClusterOutputHub(settings.REDIS_URL, name=name)
    streams = [f"{redis_prefix}:out:{{{i}}}" for i in range(300)]
    assert len({client.keyslot(s) for s in streams}) > 250  # spread over the whole cluster
    for stream in streams[::2]:  # some text before the readers come, some after
        await client.xadd(stream, {"type": "delta", "text": "a"})
    readers = [asyncio.create_task(collect(hub, s)) for s in streams]
    await asyncio.sleep(0.5)
    for stream in streams[1::2]:
        await client.xadd(stream, {"type": "delta", "text": "a"})
    for _ in range(100):  # until every node's listener has connected
        listening = await hub_connections_per_node(client, f"{name}-listener")
        if len(listening) == 3 and all(listening.values()):
            break
        await asyncio.sleep(0.1)
    counts = await hub_connections_per_node(client, name)
    for stream in streams:
        await client.xadd(stream, {"type": "delta", "text": "b"})
        await client.xadd(stream, {"type": "final", "text": "c"})
    results = await asyncio.wait_for(asyncio.gather(*readers), timeout=20)
    assert all(r == ["a", "b", "c"] for r in results)
    assert len(counts) == 3 and all(1 <= n <= 3 for n in counts.values()), counts
    await client.aclose()


async def test_resuming_after_an_event_id_skips_what_was_seen(redis_prefix):
    client = cluster.async_client(
        settings.REDIS_URL, decode_responses=True, socket_timeout=5, connect_timeout=2
    )
    stream = f"{redis_prefix}:out:{{r}}"
    ids = [await client.xadd(stream, {"type": "delta", "text": t}) for t in "xyz"]
    hub = get_hub()
    assert isinstance(hub, ClusterOutputHub)
    reader = asyncio.create_task(collect(hub, stream, after=ids[1]))
    await asyncio.sleep(0.3)
    await client.xadd(stream, {"type": "final", "text": "!"})
    assert await asyncio.wait_for(reader, timeout=10) == ["z", "!"]
    await client.aclose()


def _busy_thread(prefix: str, thread: int, rounds: int) -> int:
    """What a web thread does: single commands and pipelines over keys of every node, and a
    transaction over two slots. Returns how many rounds it ran (any error fails the test)."""
    client = get_redis()
    for n in range(rounds):
        keys = [f"{prefix}:k:{{{thread}-{n}-{i}}}" for i in range(4)]  # four slots, any nodes
        client.set(keys[0], n)
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.incr(key)
            pipe.expire(key, 60)
        pipe.get(keys[0])
        assert pipe.execute()[-1] == str(n + 1)
        with client.pipeline(transaction=True) as tx:
            tx.incr(keys[1])
            tx.incr(keys[2])
            assert tx.execute() == [2, 2]
        time.sleep(random.random() / 1000)
    return rounds


async def test_commands_past_the_bound_wait_and_the_process_keeps_three_per_node(redis_prefix):
    """24 threads and a hub feeding 300 readers share one process's connections: never more
    than three per node (two for commands, one listener), and no command fails for it."""
    client = cluster.async_client(
        settings.REDIS_URL, decode_responses=True, socket_timeout=5, connect_timeout=2
    )
    name = f"hub-load-{redis_prefix}"
    hub = ClusterOutputHub(settings.REDIS_URL, name=name)
    mine = (f"sluice-{os.getpid()}", f"{name}-listener")
    streams = [f"{redis_prefix}:out:{{load{i}}}" for i in range(300)]
    readers = [asyncio.create_task(collect(hub, s)) for s in streams]
    most: Counter = Counter()

    async def sample():
        while True:
            for node in client.get_primaries():
                listed = await client.client_list(target_nodes=node)
                count = sum(1 for c in listed if c["name"] in mine)
                most[node.name] = max(most[node.name], count)
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=24) as threads:
        busy = [loop.run_in_executor(threads, _busy_thread, redis_prefix, t, 40) for t in range(24)]
        for round_ in range(3):
            for stream in streams:
                await client.xadd(stream, {"type": "delta", "text": str(round_)})
            await asyncio.sleep(0.05)
        assert await asyncio.gather(*busy) == [40] * 24
    for stream in streams:
        await client.xadd(stream, {"type": "final", "text": "."})
    results = await asyncio.wait_for(asyncio.gather(*readers), timeout=30)
    sampler.cancel()
    assert all(r == ["0", "1", "2", "."] for r in results)
    assert len(most) == 3 and all(2 <= n <= 3 for n in most.values()), most
    await client.aclose()


async def test_the_hub_ends_when_it_is_cancelled_as_it_wakes(redis_prefix):
    """Closing an event loop cancels each task once and waits for them all. A hub that swallows
    that cancel (asyncio.wait_for does on Python 3.11 when the awaited event is set in the same
    step) keeps reading for ever, and the loop's close never returns."""
    hub = ClusterOutputHub(settings.REDIS_URL, name=f"hub-test-{redis_prefix}", block_ms=60_000)
    reader = asyncio.create_task(collect(hub, f"{redis_prefix}:out:{{w}}"))
    await asyncio.sleep(0.5)  # placed, subscribed and read once: the hub waits to be woken
    hub._wake.set()  # what a notification does
    hub._task.cancel()  # what the loop's close does, in the same step
    done, _ = await asyncio.wait({hub._task}, timeout=5)
    assert done and hub._task.cancelled()
    reader.cancel()
