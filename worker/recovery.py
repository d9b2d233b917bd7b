"""Work that nobody runs any more: found by the live workers and run again.

Every few seconds (`interval_seconds`) a worker with free slots looks for:

- work delivered to itself that it is not running (an attempt that gave up while Redis was
  away, or a worker restarted under the same id): run again;
- work pending on consumers of the shared streams it reads (its model's, and the one for work
  that names no model) whose heartbeat is gone, idle past `claim_idle_ms`: claimed with
  XCLAIM and run again;
- the affinity streams of workers whose heartbeat is gone (it expired, or the worker said it
  left): the entries nobody has read move back to their model's shared stream at once, those
  the worker had read once they are idle past `claim_idle_ms` (as on the shared streams), so a
  worker that was only paused is not raced for the answer it is writing. The stream and its
  group stay, so a paused worker finds the rest when it resumes.

Each run is a new attempt (`transitions.start` counts them and fences the old one out). What a
dead worker was running is suspect and runs alone (isolation.py); a request that failed too many
attempts is dead-lettered there, so work that kills its workers ends visibly.
"""

from __future__ import annotations

import logging
import time

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from contract import protocol, transitions
from contract.protocol import Keys

log = logging.getLogger("sluice.worker.recovery")

ClaimedEntry = tuple[str, dict[str, str], str]  # (entry id, fields, stream)
REHOME_LOCK_SECONDS = 10  # one live worker moves a dead one's backlog at a time


class Reclaimer:
    def __init__(
        self,
        *,
        redis_client: aioredis.Redis,
        keys: Keys,
        worker_id: str,
        claim_idle_ms: int,
        interval_seconds: float = 2.0,
        running: dict | None = None,
        shared_streams: tuple[str, ...] | None = None,
    ) -> None:
        self.redis = redis_client
        self.keys = keys
        self.worker_id = worker_id
        self.claim_idle_ms = claim_idle_ms
        self.interval_seconds = interval_seconds
        # (stream, entry id) of what this worker runs
        self.running = running if running is not None else {}
        self.shared_streams = shared_streams or (keys.work,)
        self._last_run = 0.0

    async def maybe_reclaim(self, *, limit: int) -> list[ClaimedEntry]:
        """At most `limit` entries to run again; looks every `interval_seconds` at most, so
        the common path costs nothing."""
        if limit <= 0 or time.monotonic() - self._last_run < self.interval_seconds:
            return []
        self._last_run = time.monotonic()
        try:
            claimed = await self._own_forgotten(limit)
            for consumer in await self._dead_consumers():
                await self.rehome(consumer)  # costs no slot: the backlog goes to any worker
                if len(claimed) < limit:
                    claimed += await self._claim_from(consumer, limit=limit - len(claimed))
            return claimed
        except ResponseError as exc:
            if transitions.is_missing_group(exc):
                raise  # the read loop recreates the groups
            log.warning("reclaim skipped: %s", exc)
            return []

    async def _own_forgotten(self, limit: int) -> list[ClaimedEntry]:
        """Entries delivered to this worker that no task of its runs."""
        found: list[ClaimedEntry] = []
        for stream in (self.keys.work_for(self.worker_id), *self.shared_streams):
            response = await self.redis.xreadgroup(
                protocol.WORKER_GROUP,
                self.worker_id,
                {stream: "0"},
                count=limit + len(self.running),
            )
            for _, entries in response or []:
                for entry_id, fields in entries:
                    if (stream, entry_id) in self.running or len(found) >= limit:
                        continue
                    if not fields:  # deleted from the stream while pending: nothing to run
                        await self.redis.xack(stream, protocol.WORKER_GROUP, entry_id)
                        continue
                    log.warning("re-running %s, delivered here but not running", fields.get("id"))
                    found.append((entry_id, fields, stream))
        return found

    async def _dead_consumers(self) -> list[str]:
        dead = []
        for stream in self.shared_streams:
            for consumer in await self.redis.xinfo_consumers(stream, protocol.WORKER_GROUP):
                name = consumer["name"]
                if name == self.worker_id or name in dead or not consumer.get("pending"):
                    continue
                if not await self.redis.exists(self.keys.heartbeat(name)):
                    dead.append(name)
        # Workers whose heartbeat key expired (three missed beats): their affinity streams'
        # backlog goes back at once, whether or not they had work on a shared stream.
        names = [
            n
            for n in await self.redis.zrange(self.keys.workers, 0, -1)
            if n != self.worker_id and n not in dead
        ]
        if names:
            pipe = self.redis.pipeline(transaction=False)
            for name in names:
                pipe.exists(self.keys.heartbeat(name))
            dead += [n for n, alive in zip(names, await pipe.execute(), strict=True) if not alive]
        return dead

    async def _claim_from(self, consumer: str, *, limit: int) -> list[ClaimedEntry]:
        claimed: list[ClaimedEntry] = []
        for stream in self.shared_streams:
            if len(claimed) < limit:
                claimed += await self._claim_on(stream, consumer, limit=limit - len(claimed))
        return claimed

    async def _claim_on(self, stream: str, consumer: str, *, limit: int) -> list[ClaimedEntry]:
        pending = await self.redis.xpending_range(
            stream,
            protocol.WORKER_GROUP,
            min="-",
            max="+",
            count=max(limit, 1) * 4,
            consumername=consumer,
            idle=self.claim_idle_ms,
        )
        claimed: list[ClaimedEntry] = []
        for entry in pending:
            if len(claimed) >= limit:
                break
            entry_id = entry["message_id"]
            entries = await self.redis.xclaim(
                stream,
                protocol.WORKER_GROUP,
                self.worker_id,
                min_idle_time=self.claim_idle_ms,
                message_ids=[entry_id],
            )
            if not entries:
                continue  # another worker claimed it first
            _, fields = entries[0]
            if not fields:  # deleted while pending: nothing to run
                await self.redis.xack(stream, protocol.WORKER_GROUP, entry_id)
                continue
            log.warning("re-running %s from dead worker %s", fields.get("id"), consumer)
            claimed.append((entry_id, fields, stream))
        return claimed

    async def rehome(self, worker_id: str) -> int:
        """Moves the entries of `worker_id`'s affinity stream to their models' shared streams,
        one live worker at a time (a lock): for a dead worker, every entry nobody has read and
        those it read that are idle past `claim_idle_ms`; for this worker, leaving (or taken out
        of routing by its breaker), only those it has not read (what it read, it runs or gives
        back). Returns how many moved."""
        stream = self.keys.work_for(worker_id)
        leaving = worker_id == self.worker_id
        lock = self.keys.reclaim_lock(worker_id)
        if not leaving and not await self.redis.set(
            lock, self.worker_id, nx=True, ex=REHOME_LOCK_SECONDS
        ):
            return 0
        try:
            exists = await self.redis.exists(stream)
            groups = await self.redis.xinfo_groups(stream) if exists else []
            read = next(
                (g["last-delivered-id"] for g in groups if g["name"] == protocol.WORKER_GROUP),
                "0-0",
            )
            entries = await self.redis.xrange(stream, min=f"({read}")
            still_pending = False
            if not leaving and groups:
                pending = await self.redis.xpending_range(
                    stream,
                    protocol.WORKER_GROUP,
                    min="-",
                    max="+",
                    count=1000,
                    consumername=worker_id,
                )
                idle = [
                    p["message_id"]
                    for p in pending
                    if p["time_since_delivered"] >= self.claim_idle_ms
                ]
                still_pending = len(idle) < len(pending)
                for entry_id in idle:
                    entries += await self.redis.xrange(stream, min=entry_id, max=entry_id)
            if entries:
                pipe = self.redis.pipeline(transaction=False)
                for entry_id, fields in entries:
                    transitions.work_returned(pipe, self.keys, stream, entry_id, fields)
                await pipe.execute()
                log.warning(
                    "moved %d entries from worker %s's stream to the shared streams",
                    len(entries),
                    worker_id,
                )
            if not leaving and not still_pending:
                await self.redis.zrem(self.keys.workers, worker_id)
            return len(entries)
        finally:
            if not leaving:
                await self.redis.delete(lock)
