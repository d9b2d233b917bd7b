"""One multiplexed reader of output streams per web process (one Redis node).

Blocking reads cannot share a connection, so one blocking XREAD per open chat would multiply
Redis connections by the number of chats. Instead a single task runs one XREAD over every
stream some subscriber watches, on one dedicated connection, and fans entries out to in-process
queues. A new subscription interrupts the blocking read (CLIENT UNBLOCK from the control
connection) unless it returns by itself within a few milliseconds; the subscriber's catch-up
read shows the stream's first entries meanwhile, so it adds no latency. Under load the reads
are paced, a few milliseconds apart, so that each takes a whole burst of the workers' writes.
Total: the reader and at most two control connections per process, whatever the number of open
chats.

Subscribing, catching up and handing entries over is hub_base.py's, shared with the hub for a
Redis Cluster (cluster_hub.py: one listener per node); `get_hub` picks the one REDIS_URL needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from apps.streams.cluster_hub import ClusterOutputHub
from apps.streams.hub_base import Entry, SubscriberHub, Subscription, stream_id_key
from contract.cancelling import raise_if_cancelled
from contract.cluster import is_cluster_url

__all__ = ["Entry", "OutputHub", "Subscription", "XreadPacker", "get_hub", "stream_id_key"]

log = logging.getLogger("sluice.hub")

# Following this many streams, a read that found entries is followed by a short pause before
# the next: a worker writes every running answer's text in one burst per tick, and a read sent
# mid-burst takes a few of its entries where one sent a moment later takes them all. A read
# costs the web and Redis in proportion to the streams it names (Redis registers the blocked
# read on each), so the pause grows with them: the reads' cost per second stays about level as
# chats open, and each read takes more entries. With few chats open every entry is read at once.
BUSY_STREAMS = 16
PAUSE_PER_STREAM_SECONDS = 0.0001  # 100 streams: 10 ms between reads
PAUSE_MOST_SECONDS = 0.015  # the most an entry waits for its read (time to first token too)
# A new stream ends a blocked read only once it has waited this long: a busy hub's read returns
# by itself sooner, and the stream's first entries reach its subscriber meanwhile through the
# subscriber's own catch-up read (hub_base.py).
UNBLOCK_GRACE_SECONDS = 0.005


class OutputHub(SubscriberHub):
    def __init__(self, redis_url: str, *, name: str = "sluice-hub", block_ms: int = 5000) -> None:
        super().__init__()
        self.redis_url = redis_url
        self.name = name  # CLIENT SETNAME of its connections, to count them in CLIENT LIST
        self.block_ms = block_ms
        self._reader: aioredis.Redis | None = None
        self._control: aioredis.Redis | None = None
        self._reader_id: int | None = None
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._blocked = False
        self._reads = 0  # reads sent so far: tells a blocked read from the next one
        self._unblocking: asyncio.Task | None = None
        self._packer = XreadPacker()

    @property
    def control(self) -> aioredis.Redis:
        """Shared non-blocking client (a small pool) for catch-up reads and commands."""
        if self._control is None:
            # A blocking pool: past two connections, callers wait for one instead of failing.
            pool = aioredis.BlockingConnectionPool.from_url(
                self.redis_url,
                decode_responses=True,
                max_connections=2,
                timeout=settings.REDIS_SOCKET_TIMEOUT,
                socket_timeout=settings.REDIS_SOCKET_TIMEOUT,
                socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT,
                client_name=f"{self.name}-control",
            )
            self._control = aioredis.Redis(connection_pool=pool)
        return self._control

    # -- the reader task ---------------------------------------------------------------------

    def _forget(self, stream: str) -> None:
        self._packer.forget(stream)

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="output-hub")

    def _interrupt(self) -> None:
        self._wake.set()
        if self._blocked and self._unblocking is None:
            self._unblocking = asyncio.get_running_loop().create_task(self._unblock())

    async def _unblock(self) -> None:
        """Ends the blocking XREAD (unless it ends by itself within the grace) so the next one
        includes the new stream. Retried: the read may not have reached Redis yet, and then
        UNBLOCK finds nothing to end."""
        read = self._reads
        try:
            await asyncio.sleep(UNBLOCK_GRACE_SECONDS)
            if self._reads != read:
                return  # that read ended: the next one names the new stream
            for _ in range(200):
                if not self._blocked or self._reader_id is None:
                    return  # between reads: the next read sees the new stream anyway
                unblocked = await self.control.execute_command("CLIENT", "UNBLOCK", self._reader_id)
                if unblocked:
                    return
                await asyncio.sleep(0.001)
        except (RedisConnectionError, RedisTimeoutError):
            return
        finally:
            self._unblocking = None

    async def _xread(self, streams: dict[str, str]) -> list[tuple[str, list[Entry]]]:
        """XREAD over `streams` ({stream: last id}), sent pre-encoded: with a hundred streams
        redis-py's generic encoder spends more CPU on each read than the read itself."""
        connection = self._reader.connection
        await connection.send_packed_command(self._packer.xread(streams, block=self.block_ms))
        reply = await connection.read_response()
        return [
            (
                stream,
                [
                    (entry_id, dict(zip(flat[::2], flat[1::2], strict=True)))
                    for entry_id, flat in entries
                ],
            )
            for stream, entries in reply or []
        ]

    async def _connect_reader(self) -> None:
        # Its read blocks up to block_ms by design: only a reply later than that means trouble.
        self._reader = aioredis.Redis.from_url(
            self.redis_url,
            decode_responses=True,
            single_connection_client=True,
            client_name=f"{self.name}-reader",
            socket_timeout=self.block_ms / 1000 + settings.REDIS_SOCKET_TIMEOUT,
            socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT,
        )
        self._reader_id = await self._reader.client_id()

    async def _run(self) -> None:
        while True:
            raise_if_cancelled()  # one its Redis client swallowed (contract/cancelling.py)
            if not self._subs:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                if self._reader is None:
                    await self._connect_reader()
                streams = dict(self._cursors)
                if not streams:  # everyone left while the reader connected
                    continue
                self._wake.clear()
                self._blocked = True
                self._reads += 1
                try:
                    response = await self._xread(streams)
                finally:
                    self._blocked = False
            except (RedisConnectionError, RedisTimeoutError) as exc:
                log.warning("output hub lost Redis (%s); reconnecting", exc)
                with contextlib.suppress(Exception):
                    await self._reader.aclose()
                self._reader = None
                await asyncio.sleep(0.5)
                continue
            for stream, entries in response or []:
                self._deliver(stream, entries)
            if response and len(streams) >= BUSY_STREAMS:
                await asyncio.sleep(busy_pause(len(streams)))


def busy_pause(streams: int) -> float:
    """Seconds between a read that found entries and the next, with `streams` followed."""
    if streams < BUSY_STREAMS:
        return 0.0
    return min(PAUSE_MOST_SECONDS, streams * PAUSE_PER_STREAM_SECONDS)


class XreadPacker:
    """Encodes `XREAD COUNT n BLOCK ms STREAMS k1 k2 … id1 id2 …` in the Redis protocol, each
    stream name encoded once per subscription rather than once per read."""

    def __init__(self, *, count: int = 500) -> None:
        self.count = count
        self._names: dict[str, bytes] = {}

    def xread(self, streams: dict[str, str], *, block: int) -> bytes:
        head = [
            b"XREAD",
            b"COUNT",
            str(self.count).encode(),
            b"BLOCK",
            str(block).encode(),
            b"STREAMS",
        ]
        parts = [b"*%d\r\n" % (len(head) + 2 * len(streams))]
        parts.extend(b"$%d\r\n%s\r\n" % (len(word), word) for word in head)
        parts.extend(self._name(stream) for stream in streams)
        for last in streams.values():
            encoded = last.encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(encoded), encoded))
        return b"".join(parts)

    def forget(self, stream: str) -> None:
        self._names.pop(stream, None)

    def _name(self, stream: str) -> bytes:
        encoded = self._names.get(stream)
        if encoded is None:
            raw = stream.encode()
            encoded = self._names[stream] = b"$%d\r\n%s\r\n" % (len(raw), raw)
        return encoded


_hubs: dict[int, SubscriberHub] = {}


def get_hub() -> SubscriberHub:
    """The process's hub for the running event loop (daphne runs one loop per process)."""
    loop = asyncio.get_running_loop()
    hub = _hubs.get(id(loop))
    # A closed loop's id can come back for a new loop (tests run one per test): its hub's tasks
    # and locks belong to the old one.
    if hub is None or hub.loop is not loop:
        # On a Redis Cluster one blocking read cannot span slots: a reader per node instead.
        kind = ClusterOutputHub if is_cluster_url(settings.REDIS_URL) else OutputHub
        hub = _hubs[id(loop)] = kind(settings.REDIS_URL, name=f"sluice-hub-{os.getpid()}")
        hub.loop = loop
    return hub
