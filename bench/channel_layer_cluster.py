"""Whether Channels' Redis channel layer (channels-redis) can carry user-addressed messages on a
Redis Cluster, which Sluice supports: a local 3-master cluster (devstack/cluster.py), both of
channels-redis's layers, a message to each of 50 users' groups, each read back.

channels-redis is not one of Sluice's dependencies; run this in a throwaway venv that has it:

    python -m venv /tmp/ch && /tmp/ch/bin/pip install channels-redis django -e .
    /tmp/ch/bin/python bench/channel_layer_cluster.py

Last line: `channel_layer: core <n>/50 delivered (<error>), pubsub <m>/50 delivered (<error>)`.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from devstack.cluster import local_cluster  # noqa: E402

USERS = 50


async def deliver(layer) -> tuple[int, str]:
    """Messages sent to `user.<n>` groups that a channel in each group receives."""
    delivered, error = 0, "no error"
    try:
        channels = []
        for n in range(USERS):
            channel = await layer.new_channel()
            await layer.group_add(f"user.{n}", channel)
            channels.append(channel)
        for n in range(USERS):
            await layer.group_send(f"user.{n}", {"type": "account.event", "n": n})
        for n, channel in enumerate(channels):
            message = await asyncio.wait_for(layer.receive(channel), timeout=5)
            delivered += message.get("n") == n
    except Exception as exc:  # what the layer raises on a cluster is the finding
        error = f"{type(exc).__name__}: {str(exc)[:80]}"
    return delivered, error


async def main() -> None:
    from channels_redis.core import RedisChannelLayer
    from channels_redis.pubsub import RedisPubSubChannelLayer

    with tempfile.TemporaryDirectory() as root, local_cluster(Path(root)) as cluster:
        host, port = cluster.nodes[0].address
        hosts = [f"redis://{host}:{port}/0"]
        core = await deliver(RedisChannelLayer(hosts=hosts))
        pubsub = await deliver(RedisPubSubChannelLayer(hosts=hosts))
    print(
        f"channel_layer: core {core[0]}/{USERS} delivered ({core[1]}), "
        f"pubsub {pubsub[0]}/{USERS} delivered ({pubsub[1]})"
    )


if __name__ == "__main__":
    asyncio.run(main())
