"""One multiplexed reader of output streams per web process.

Blocking reads cannot share a connection, so one blocking XREAD per open chat would multiply
Redis connections by the number of chats. Instead a single task runs one XREAD over every
stream some subscriber watches, on one dedicated connection, and fans entries out to in-process
queues. A new subscription interrupts the blocking read at once (CLIENT UNBLOCK from the control
connection), so it adds no latency. Total: two connections per process, whatever the number of
open chats.

A subscriber first registers, then catches up with XRANGE from its last seen id, then drains its
queue, skipping ids it has already seen: nothing is missed and nothing is shown twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.protocol import EventType

log = logging.getLogger("sluice.hub")

Entry = tuple[str, dict[str, str]]


def stream_id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(eq=False)
class Subscription:
    stream: str
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


class OutputHub:
    def __init__(self, redis_url: str, *, name: str = "sluice-hub", block_ms: int = 5000) -> None:
        self.redis_url = redis_url
        self.name = name  # CLIENT SETNAME of its connections, to count them in CLIENT LIST
        self.block_ms = block_ms
        self._subs: dict[str, set[Subscription]] = {}
        self._cursors: dict[str, str] = {}
        self._reader: aioredis.Redis | None = None
        self._control: aioredis.Redis | None = None
        self._reader_id: int | None = None
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._blocked = False
        self._unblocking: asyncio.Task | None = None
        self._packer = XreadPacker()

    @property
    def control(self) -> aioredis.Redis:
        """Shared non-blocking client (a small pool) for catch-up reads and commands."""
        if self._control is None:
            # A blocking pool: past two connections, callers wait for one instead of failing.
            pool = aioredis.BlockingConnectionPool.from_url(
                self.redis_url, decode_responses=True, max_connections=2,
                timeout=settings.REDIS_SOCKET_TIMEOUT,
                socket_timeout=settings.REDIS_SOCKET_TIMEOUT,
                socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT,
                client_name=f"{self.name}-control",
            )  # fmt: skip
            self._control = aioredis.Redis(connection_pool=pool)
        return self._control

    # -- subscribing -------------------------------------------------------------------------

    async def events(self, stream: str, *, after: str = "0") -> AsyncIterator[Entry]:
        """Every entry of `stream` after id `after`, live, until a final event."""
        async for batch in self.batches(stream, after=after):
            for entry in batch:
                yield entry

    async def batches(self, stream: str, *, after: str = "0") -> AsyncIterator[list[Entry]]:
        """The same entries, in lists of those already arrived together: a reader that fell
        behind catches up in one step instead of one wake-up per entry."""
        sub = Subscription(stream)
        self._add(sub, after)
        last = after if after not in ("", "$") else "0"
        try:
            # First what the stream already holds, then what the reader hands over; entries
            # the backlog already covered are dropped.
            arrived = await self.control.xrange(stream, min=f"({last}" if last != "0" else "-")
            while True:
                fresh = [e for e in arrived if stream_id_key(e[0]) > stream_id_key(last)]
                batch, ended = _until_final(fresh)
                if batch:
                    last = batch[-1][0]
                    yield batch
                if ended:
                    return
                arrived = [await sub.queue.get()]
                while not sub.queue.empty():
                    arrived.append(sub.queue.get_nowait())
        finally:
            self._remove(sub)

    def _add(self, sub: Subscription, after: str) -> None:
        subs = self._subs.setdefault(sub.stream, set())
        subs.add(sub)
        if sub.stream not in self._cursors:
            self._cursors[sub.stream] = after if after and after != "$" else "0"
        self._ensure_running()
        self._interrupt()

    def _remove(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.stream)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.stream]
                self._cursors.pop(sub.stream, None)
                self._packer.forget(sub.stream)

    # -- the reader task ---------------------------------------------------------------------

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="output-hub")

    def _interrupt(self) -> None:
        self._wake.set()
        if self._blocked and self._unblocking is None:
            self._unblocking = asyncio.get_running_loop().create_task(self._unblock())

    async def _unblock(self) -> None:
        """Ends the blocking XREAD now so the next one includes the new stream. Retried: the
        read may not have reached Redis yet, and then UNBLOCK finds nothing to end."""
        try:
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
            (stream, [(entry_id, dict(zip(flat[::2], flat[1::2], strict=True)))
                      for entry_id, flat in entries])
            for stream, entries in reply or []
        ]  # fmt: skip

    async def _connect_reader(self) -> None:
        # Its read blocks up to block_ms by design: only a reply later than that means trouble.
        self._reader = aioredis.Redis.from_url(
            self.redis_url, decode_responses=True, single_connection_client=True,
            client_name=f"{self.name}-reader",
            socket_timeout=self.block_ms / 1000 + settings.REDIS_SOCKET_TIMEOUT,
            socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT,
        )  # fmt: skip
        self._reader_id = await self._reader.client_id()

    async def _run(self) -> None:
        while True:
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
                if stream not in self._cursors:
                    continue  # everyone left while we read
                self._cursors[stream] = entries[-1][0]
                for sub in list(self._subs.get(stream, ())):
                    for entry in entries:
                        sub.queue.put_nowait(entry)


def _until_final(entries: list[Entry]) -> tuple[list[Entry], bool]:
    """`entries` up to and including a final event, and whether there was one."""
    for index, (_, fields) in enumerate(entries):
        if fields.get("type") == EventType.FINAL:
            return entries[: index + 1], True
    return entries, False


class XreadPacker:
    """Encodes `XREAD COUNT n BLOCK ms STREAMS k1 k2 … id1 id2 …` in the Redis protocol, each
    stream name encoded once per subscription rather than once per read."""

    def __init__(self, *, count: int = 500) -> None:
        self.count = count
        self._names: dict[str, bytes] = {}

    def xread(self, streams: dict[str, str], *, block: int) -> bytes:
        head = [b"XREAD", b"COUNT", str(self.count).encode(), b"BLOCK", str(block).encode(),
                b"STREAMS"]  # fmt: skip
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


_hubs: dict[int, OutputHub] = {}


def get_hub() -> OutputHub:
    """The process's hub for the running event loop (daphne runs one loop per process)."""
    loop = asyncio.get_running_loop()
    hub = _hubs.get(id(loop))
    if hub is None:
        hub = _hubs[id(loop)] = OutputHub(settings.REDIS_URL, name=f"sluice-hub-{os.getpid()}")
    return hub
