"""The output hub on a Redis Cluster: one listener per cluster node, a constant number of
connections per web process.

One XREAD cannot span slots on a cluster, and every request's stream has a slot of its own, so
the single-node hub's one blocking read over every watched stream is impossible; a blocking read
per stream would multiply connections by the number of chats. Instead each node tells the hub
which streams changed: nodes publish keyspace events for stream commands
(`notify-keyspace-events` with K and t; the hub turns them on when a node has them off), and the
hub keeps, per node, one pub/sub connection subscribed to the events of the watched streams that
node owns. A notified stream is read with a non-blocking XREAD from its cursor, the streams of
one slot in one XREAD and a node's slots in one pipelined round trip.

Connections per node: one listener, plus the reads, which go through the process's own command
client (core/redis_client.py: at most two connections per node, shared with the process's
threads; a command past them waits) on a small thread pool. So a web process holds at most three
connections per node, whatever the number of open chats.

Streams are grouped by the node that owns their slot; every `block_ms` the hub reads every
watched stream anyway (an event lost while a listener reconnected costs at most that long) and
regroups them by the cluster's current slot map, which redis-py refreshes on MOVED and on a failed
node, so a resharded slot or a promoted replica moves its streams' subscriptions to the new owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import RedisError

from apps.streams.hub_base import Entry, SubscriberHub
from contract import cluster
from contract.cancelling import cancel_and_wait, raise_if_cancelled
from core.redis_client import CLUSTER_CONNECTIONS_PER_NODE, cluster_client, get_redis

log = logging.getLogger("sluice.hub")

KEYSPACE = "__keyspace@0__:"
COUNT = 500  # entries per stream per read; a stream with more is read again at once
# Threads that run the hub's reads on the command client: as many as its connections per node.
READ_THREADS = CLUSTER_CONNECTIONS_PER_NODE


@functools.cache
def _read_threads() -> ThreadPoolExecutor:
    """One pool for every hub of the process (tests start one hub per event loop)."""
    return ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="sluice-hub")


class NodeListener:
    """One pub/sub connection to one node, subscribed to the events of the streams it owns."""

    def __init__(self, hub: ClusterOutputHub, node: str) -> None:
        self.hub, self.node = hub, node
        self.streams: set[str] = set()
        self._client: aioredis.Redis | None = None
        self._pubsub = None
        self._task: asyncio.Task | None = None
        self._changed = asyncio.Event()

    def watch(self, stream: str) -> None:
        self.streams.add(stream)
        self._changed.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"hub-{self.node}"
            )

    def unwatch(self, stream: str) -> None:
        self.streams.discard(stream)
        self._changed.set()

    async def close(self) -> None:
        if self._task is not None:
            with contextlib.suppress(Exception):
                await cancel_and_wait(self._task)
        await self._disconnect()

    async def _run(self) -> None:
        subscribed: set[str] = set()
        while True:
            raise_if_cancelled()  # one its Redis client swallowed (contract/cancelling.py)
            try:
                if self._pubsub is None:
                    subscribed = set()
                    await self._connect()
                if self._changed.is_set() or subscribed != self.streams:
                    self._changed.clear()
                    subscribed = await self._resubscribe(subscribed)
                if not subscribed:
                    await self._changed.wait()
                    continue
                message = await self._pubsub.get_message(timeout=0.05)
                if message is None:
                    continue
                stream = str(message.get("channel", ""))[len(KEYSPACE) :]
                if message["type"] == "subscribe" or message.get("data") == "xadd":
                    # A confirmed subscription reads once too: what arrived while it was
                    # on its way would otherwise wait for the next full read.
                    self.hub.notify(stream)
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                log.warning("output hub lost node %s (%s); regrouping its streams", self.node, exc)
                await self._disconnect()
                self.hub.topology_changed()
                await asyncio.sleep(0.5)

    async def _resubscribe(self, subscribed: set[str]) -> set[str]:
        wanted = set(self.streams)
        if gone := subscribed - wanted:
            await self._pubsub.unsubscribe(*(KEYSPACE + s for s in gone))
        if new := wanted - subscribed:
            await self._pubsub.subscribe(*(KEYSPACE + s for s in new))
        return wanted

    async def _connect(self) -> None:
        host, _, port = self.node.rpartition(":")
        await self.hub.ensure_keyspace_events(self.node)
        _, options = cluster.parse_cluster_url(self.hub.redis_url)
        self._client = aioredis.Redis(
            host=host,
            port=int(port),
            decode_responses=True,
            **options,
            client_name=f"{self.hub.name}-listener",
            socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT,
        )
        self._pubsub = self._client.pubsub()

    async def _disconnect(self) -> None:
        pubsub, client, self._pubsub, self._client = self._pubsub, self._client, None, None
        with contextlib.suppress(Exception):
            if pubsub is not None:
                await pubsub.aclose()
        with contextlib.suppress(Exception):
            if client is not None:
                await client.aclose()


class ClusterOutputHub(SubscriberHub):
    def __init__(self, redis_url: str, *, name: str = "sluice-hub", block_ms: int = 5000) -> None:
        super().__init__()
        self.redis_url = redis_url
        self.name = name
        self.block_ms = block_ms
        self._control = None
        self._creating = threading.Lock()
        self._owner: dict[str, str] = {}  # stream -> the node ("host:port") it is watched on
        self._listeners: dict[str, NodeListener] = {}
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._regroup_now = False
        self._checked_events: set[str] = set()
        self._task: asyncio.Task | None = None

    @property
    def control(self) -> cluster.SluiceRedisCluster:
        """The process's cluster client (its connections shared with the process's threads),
        or one of its own for a hub of another cluster."""
        if self._control is None:
            with self._creating:  # two read threads may ask first at once
                if self._control is None:
                    self._control = self._new_client()
        return self._control

    def _new_client(self) -> cluster.SluiceRedisCluster:
        if self.redis_url == settings.REDIS_URL:
            return get_redis()
        return cluster_client(self.redis_url, client_name=f"{self.name}-control")

    async def _call(self, call):
        """`call(client)` on the read threads: the client blocks (and connects when first
        used: that happens on a read thread too, never on the event loop)."""
        return await asyncio.get_running_loop().run_in_executor(
            _read_threads(), lambda: call(self.control)
        )

    async def _ready(self) -> cluster.SluiceRedisCluster:
        if self._control is None:
            await self._call(lambda client: None)
        return self._control

    async def _refresh_topology(self) -> None:
        """Rereads the slot map (redis-py drops the pools of nodes that left)."""
        await self._call(lambda client: client.nodes_manager.initialize())

    async def _backlog(self, stream: str, last: str) -> list[Entry]:
        low = f"({last}" if last != "0" else "-"
        return await self._call(lambda client: client.xrange(stream, min=low))

    # -- which node each stream is watched on ---------------------------------------------------

    def notify(self, stream: str) -> None:
        if stream in self._cursors:
            self._dirty.add(stream)
            self._wake.set()

    def topology_changed(self) -> None:
        self._regroup_now = True
        self._wake.set()

    def _forget(self, stream: str) -> None:
        node = self._owner.pop(stream, None)
        if node in self._listeners:
            self._listeners[node].unwatch(stream)
        self._dirty.discard(stream)

    def _place(self, stream: str) -> None:
        """Subscribes to `stream`'s events on the node that owns its slot now."""
        node = self.control.get_node_from_key(stream).name
        old = self._owner.get(stream)
        if old == node:
            return
        if old in self._listeners:
            self._listeners[old].unwatch(stream)
        self._owner[stream] = node
        listener = self._listeners.get(node)
        if listener is None:
            listener = self._listeners[node] = NodeListener(self, node)
        listener.watch(stream)
        self._dirty.add(stream)

    async def _regroup(self, *, refresh: bool) -> None:
        """Moves subscriptions after a failover or resharding (`refresh`: reread the slot map
        first; otherwise the one redis-py keeps current on MOVED); closes the listeners of nodes
        that own no watched stream any longer (a failed master), so connections stay fixed."""
        if refresh:
            await self._refresh_topology()
        await self._ready()
        for stream in list(self._cursors):
            self._place(stream)
        for node, listener in list(self._listeners.items()):
            if not listener.streams:
                del self._listeners[node]
                await listener.close()

    async def ensure_keyspace_events(self, node: str) -> None:
        """Turns on the keyspace events of stream commands on `node` when they are off (a
        managed Redis that refuses CONFIG needs them set by its operator; until then the hub
        falls back on its periodic read)."""
        if node in self._checked_events:
            return
        target = self.control.get_node(node_name=node)
        try:
            current = (
                await self._call(
                    lambda c: c.config_get("notify-keyspace-events", target_nodes=target)
                )
            ).get("notify-keyspace-events", "")
            has_streams = "t" in current or "A" in current
            if "K" not in current or not has_streams:
                wanted = "".join(sorted(set(current) | {"K", "t"}))
                await self._call(
                    lambda c: c.config_set("notify-keyspace-events", wanted, target_nodes=target)
                )
            self._checked_events.add(node)
        except (RedisError, AttributeError) as exc:
            log.warning(
                "output hub cannot turn on keyspace events on %s (%s): set "
                "notify-keyspace-events to include K and t",
                node,
                exc,
            )

    # -- the reader task ----------------------------------------------------------------------

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="output-hub")

    def _interrupt(self) -> None:
        self._wake.set()  # the reader places the new stream on its node and reads it once

    async def _place_new(self) -> None:
        if any(stream not in self._owner for stream in self._cursors):
            await self._ready()
            for stream in list(self._cursors):
                if stream not in self._owner:
                    self._place(stream)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        full_read_at = loop.time() + self.block_ms / 1000
        while True:
            raise_if_cancelled()
            self._wake.clear()  # before looking: a wake-up from now on is not lost
            if not self._subs:
                await self._wake.wait()
                continue
            unplaced = any(stream not in self._owner for stream in self._cursors)
            if not self._dirty and not self._regroup_now and not unplaced:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0, full_read_at - loop.time())):
                        await self._wake.wait()
            try:
                await self._place_new()
                if loop.time() >= full_read_at or self._regroup_now:
                    refresh, self._regroup_now = self._regroup_now, False
                    full_read_at = loop.time() + self.block_ms / 1000
                    await self._regroup(refresh=refresh)
                    self._dirty.update(self._cursors)
            except (RedisError, OSError) as exc:
                log.warning("output hub cannot reach the cluster (%s)", exc)
                self._regroup_now = True
                await asyncio.sleep(0.5)
                continue
            streams = {s: self._cursors[s] for s in self._dirty if s in self._cursors}
            self._dirty.clear()
            if not streams:
                continue
            try:
                replies = await self._read(streams)
            except (RedisError, OSError) as exc:
                log.warning("output hub read failed (%s); regrouping", exc)
                self._dirty.update(streams)
                self.topology_changed()
                await asyncio.sleep(0.5)
                continue
            for stream, entries in replies:
                self._deliver(stream, entries)
                if len(entries) >= COUNT:
                    self._dirty.add(stream)  # more where these came from
            self._follow_moved(streams)

    def _follow_moved(self, streams) -> None:
        """A read that met MOVED (a slot resharded away) has updated the slot map: the
        streams' subscriptions follow it now rather than at the next full read."""
        try:
            for stream in streams:
                if stream in self._cursors:
                    self._place(stream)
        except RedisError:
            self.topology_changed()  # a slot nobody serves (mid-failover): regroup later

    async def _read(self, streams: dict[str, str]) -> list[tuple[str, list[Entry]]]:
        """A non-blocking XREAD per slot, all in one pipeline (a round trip per node)."""
        by_slot: dict[int, dict[str, str]] = {}
        for stream, last in streams.items():
            by_slot.setdefault(self.control.keyslot(stream), {})[stream] = last

        def read(control):
            pipe = control.pipeline(transaction=False)
            for group in by_slot.values():
                pipe.xread(group, count=COUNT)
            return pipe.execute()

        results = []
        for reply in await self._call(read):
            for stream, entries in reply or []:
                results.append((stream, [(entry_id, fields) for entry_id, fields in entries]))
        return results
