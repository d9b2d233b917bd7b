"""What every output hub does for its subscribers, however it reads Redis.

A subscriber first registers, then catches up with XRANGE from its last seen id, then drains its
queue, skipping ids it has already seen: nothing is missed and nothing is shown twice. The reader
(apps/streams/hub.py on one Redis, apps/streams/cluster_hub.py on a cluster) fills the queues.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from contract.protocol import EventType

Entry = tuple[str, dict[str, str]]


def stream_id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(eq=False)
class Subscription:
    stream: str
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


class SubscriberHub:
    """Subscriptions and cursors; a subclass provides `control` (a client for catch-up reads)
    and the reader task (`_ensure_running`, `_interrupt`, and `_forget` of a stream)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None  # the one its tasks run on
        self._subs: dict[str, set[Subscription]] = {}
        self._cursors: dict[str, str] = {}

    async def events(self, stream: str, *, after: str = "0") -> AsyncIterator[Entry]:
        """Every entry of `stream` after id `after`, live, until a final event."""
        async for batch in self.batches(stream, after=after):
            for entry in batch:
                yield entry

    async def batches(
        self, stream: str, *, after: str = "0", written: Entry | None = None
    ) -> AsyncIterator[list[Entry]]:
        """The same entries, in lists of those already arrived together: a reader that fell
        behind catches up in one step instead of one wake-up per entry. `written`: the
        stream's first entry, as the caller just wrote it (a request it published): when no
        one follows the stream yet, the reader starts after it, so no catch-up read is made."""
        sub = Subscription(stream)
        known = [written] if written is not None and stream not in self._cursors else []
        self._add(sub, known[-1][0] if known else after)
        last = after if after not in ("", "$") else "0"
        try:
            # First what the stream already holds, then what the reader hands over; entries
            # the backlog already covered are dropped.
            arrived = known or await self._backlog(stream, last)
            while True:
                fresh = [e for e in arrived if stream_id_key(e[0]) > stream_id_key(last)]
                batch, ended = until_final(fresh)
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

    async def _backlog(self, stream: str, last: str) -> list[Entry]:
        """What `stream` holds after id `last` (a subscriber's catch-up)."""
        return await self.control.xrange(stream, min=f"({last}" if last != "0" else "-")

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
                self._forget(sub.stream)

    def _deliver(self, stream: str, entries: list[Entry]) -> None:
        """Hands what the reader read to the stream's subscribers and moves its cursor."""
        if stream not in self._cursors or not entries:
            return  # everyone left while it read
        self._cursors[stream] = entries[-1][0]
        for sub in list(self._subs.get(stream, ())):
            for entry in entries:
                sub.queue.put_nowait(entry)

    # -- the reader's part -----------------------------------------------------------------------

    @property
    def control(self):
        raise NotImplementedError

    def _ensure_running(self) -> None:
        raise NotImplementedError

    def _interrupt(self) -> None:
        raise NotImplementedError

    def _forget(self, stream: str) -> None:
        """No subscriber watches `stream` any longer."""


def until_final(entries: list[Entry]) -> tuple[list[Entry], bool]:
    """`entries` up to and including a final event, and whether there was one."""
    for index, (_, fields) in enumerate(entries):
        if fields.get("type") == EventType.FINAL:
            return entries[: index + 1], True
    return entries, False
