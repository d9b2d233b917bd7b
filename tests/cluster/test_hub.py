"""The output hub on a cluster: a listener per node, constant connections, nothing missed."""

from __future__ import annotations

import asyncio
from collections import Counter

from django.conf import settings

from apps.chat.cluster_hub import ClusterOutputHub
from apps.chat.hub import get_hub
from worker import cluster


async def collect(hub, stream: str, after: str = "0") -> list[str]:
    return [fields["text"] async for _, fields in hub.events(stream, after=after)]


async def hub_connections_per_node(client, name: str) -> Counter:
    counts = Counter()
    for node in client.get_primaries():
        listed = await client.client_list(target_nodes=node)
        counts[node.name] = sum(1 for c in listed if c["name"].startswith(name))
    return counts


async def test_readers_on_every_node_share_a_few_connections_per_node(redis_prefix):
    client = cluster.async_client(settings.REDIS_URL, decode_responses=True,
                                  socket_timeout=5, connect_timeout=2)  # fmt: skip
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
    client = cluster.async_client(settings.REDIS_URL, decode_responses=True,
                                  socket_timeout=5, connect_timeout=2)  # fmt: skip
    stream = f"{redis_prefix}:out:{{r}}"
    ids = [await client.xadd(stream, {"type": "delta", "text": t}) for t in "xyz"]
    hub = get_hub()
    assert isinstance(hub, ClusterOutputHub)
    reader = asyncio.create_task(collect(hub, stream, after=ids[1]))
    await asyncio.sleep(0.3)
    await client.xadd(stream, {"type": "final", "text": "!"})
    assert await asyncio.wait_for(reader, timeout=10) == ["z", "!"]
    await client.aclose()
