"""contract/cluster.py's forks of redis-py, on and off, on a local 3-master cluster
(devstack/cluster.py): the speed of the two that claim speed, and whether the installed redis-py
still has each limitation the others work around (its own classes, the fork left out).

    .venv/bin/python bench/cluster_forks.py [--seconds 3] [--pairs 2] [--url redis+cluster://...]

Speed, each side timed alternately `--pairs` times, in one process (the fork patched out):
- stream reads: the output hub's read, a pipeline of one non-blocking XREAD per slot (20
  streams over the 3 masters), one thread; off, redis-py asks a node COMMAND GETKEYS for each.
- node pipelines: 8 threads (and 1), 2 connections per node, pipelines of 20 GETs over the 3
  masters in any order; off, redis-py takes every node's connection before it sends anything.

Last line: `cluster_forks: stream reads <on> vs <off> pipelines/s, node pipelines <on> vs <off>
pipelines/s (<n> vs <m> connections past the bound; one thread <on> vs <off>), redis-py
<version> still needs: <forks>`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

import redis  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402
from redis.cluster import ClusterNode, ClusterPipeline, RedisClusterException  # noqa: E402

from contract import cluster  # noqa: E402
from devstack.cluster import SlotMove, local_cluster  # noqa: E402

STREAMS = [f"bench:out:{{r{i}}}" for i in range(20)]  # 20 slots over the 3 masters
KEYS = [f"bench:k:{{r{i}}}" for i in range(20)]


@contextlib.contextmanager
def patched(owner, name: str, value):
    """`owner.name` is `value` inside the block: a fork switched off."""
    old = owner.__dict__[name]
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def without_stream_slots():
    def determine_slot(self, *args):
        return super(cluster.StreamReadSlots, self).determine_slot(*args)

    return patched(cluster.StreamReadSlots, "determine_slot", determine_slot)


def without_node_split():
    def execute(self, raise_on_error=True):
        return ClusterPipeline.execute(self, raise_on_error)

    return patched(cluster.SluicePipeline, "execute", execute)


def rate(url: str, work, *, threads: int, seconds: float) -> tuple[float, int]:
    """Pipelines a second that `threads` threads run with `work(client)`, and the connections
    the client opened past its bound (NodePool's extra ones) meanwhile."""
    client = cluster.sync_client(url, max_connections=2, timeout=5, connect_timeout=2)
    extra = [0]
    free_or_extra = cluster.NodePool._free_or_extra

    def counted(pool):
        connection = free_or_extra(pool)
        extra[0] += getattr(connection, "sluice_extra", False)
        return connection

    done = [0] * threads
    work(client)  # connected
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            work(client)
            done[i] += 1

    with patched(cluster.NodePool, "_free_or_extra", counted):
        runners = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
        started = time.monotonic()
        for runner in runners:
            runner.start()
        for runner in runners:
            runner.join()
    client.close()
    return sum(done) / (time.monotonic() - started), extra[0]


def hub_read(client) -> None:
    pipe = client.pipeline(transaction=False)
    for stream in STREAMS:
        pipe.xread({stream: "$"}, count=100)
    pipe.execute()


def node_reads(client) -> None:
    pipe = client.pipeline(transaction=False)
    for key in random.sample(KEYS, len(KEYS)):
        pipe.get(key)
    pipe.execute()


def on_off(url: str, work, switch_off, *, threads: int, seconds: float, pairs: int):
    """(on, off) means of pipelines a second and of connections past the bound."""
    on, off = [], []
    for _ in range(pairs):
        on.append(rate(url, work, threads=threads, seconds=seconds))
        with switch_off():
            off.append(rate(url, work, threads=threads, seconds=seconds))
    return [tuple(statistics.mean(x) for x in zip(*side, strict=True)) for side in (on, off)]


def queued(client, name: str, *args) -> list:
    pipe = client.pipeline(transaction=False)
    getattr(pipe, name)(*args)
    return pipe.execute()


def fails(call) -> bool:
    try:
        call()
    except (redis.RedisError, RedisClusterException, TypeError):  # 6.4: eval() takes no args
        return True
    return False


async def ask_fails(url: str, stock) -> bool:
    """A GET on a key whose slot is half migrated (the source answers ASK), sent by redis-py's
    own asyncio cluster client while the target node has a dozen free connections."""
    client = aioredis.RedisCluster(startup_nodes=stock, decode_responses=True)
    admin = cluster.sync_client(url, max_connections=2, timeout=5, connect_timeout=2)
    key = f"bench:ask:{random.random()}"
    move = SlotMove(admin, admin.keyslot(key))
    try:
        await client.set(key, "v")
        on_target = next(
            f"bench:t{i}"
            for i in range(10_000)
            if admin.get_node_from_key(f"bench:t{i}").name == move.target_name
        )
        await asyncio.gather(*(client.get(on_target) for _ in range(12)))  # 12 free there
        move.begin()
        move.migrate_keys()
        try:
            return await client.get(key) != "v"
        except redis.RedisError:  # "TTL exhausted": ASKING went on another connection
            return True
    finally:
        move.finish()
        move.close()
        admin.close()
        await client.aclose()


def still_needed(url: str) -> list[str]:
    """The forks whose redis-py limitation the installed redis-py still has."""
    nodes, _ = cluster.parse_cluster_url(url)
    plain = redis.RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in nodes], decode_responses=True
    )
    plain.hset("{b}h", "f", "v")
    multi = plain.pipeline(transaction=True)
    multi.hgetall("{b}h")
    checks = {
        "async ASK": asyncio.run(
            ask_fails(url, [aioredis.cluster.ClusterNode(h, p) for h, p in nodes])
        ),
        "MULTI callbacks": multi.execute() != [{"f": "v"}],
        "pipeline EVAL": fails(lambda: queued(plain, "eval", "return 1", 1, "{b}x")),
        "pipeline MGET": fails(lambda: queued(plain, "mget", ["{b}x", "{b}y"])),
        "cross-slot MGET": fails(lambda: plain.mget(["{b}x", "{c}y"])),
    }
    plain.close()
    return [name for name, needed in checks.items() if needed]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--url", help="a running cluster's redis+cluster:// URL")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = args.url
        if not url:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            url = stack.enter_context(local_cluster(root)).url
        setup = cluster.sync_client(url, max_connections=2, timeout=5, connect_timeout=2)
        for stream, key in zip(STREAMS, KEYS, strict=True):
            setup.xadd(stream, {"text": "x"}, maxlen=5)
            setup.set(key, "v")
        setup.close()
        timing = dict(seconds=args.seconds, pairs=args.pairs)
        reads = on_off(url, hub_read, without_stream_slots, threads=1, **timing)
        nodes = on_off(url, node_reads, without_node_split, threads=8, **timing)
        alone = on_off(url, node_reads, without_node_split, threads=1, **timing)
        needed = still_needed(url)
    print(
        f"cluster_forks: stream reads {reads[0][0]:.0f} vs {reads[1][0]:.0f} pipelines/s, "
        f"node pipelines {nodes[0][0]:.0f} vs {nodes[1][0]:.0f} pipelines/s "
        f"({nodes[0][1]:.0f} vs {nodes[1][1]:.0f} connections past the bound; "
        f"one thread {alone[0][0]:.0f} vs {alone[1][0]:.0f}), "
        f"redis-py {redis.__version__} still needs: {', '.join(needed) or 'none'}"
    )


if __name__ == "__main__":
    main()
