"""Re-running work that a dead worker left pending, and dead-lettering work that keeps failing.

Any live worker with free slots looks, every few seconds, for consumers of the work streams whose
heartbeat is gone. Their pending entries, once idle past `claim_idle_ms`, are claimed with XCLAIM
and run again by the claimer; entries delivered `max_deliveries` times go to the dead-letter
stream and their requests fail visibly. A dead worker's affinity stream is moved back to the
shared stream, so work routed to it is not stranded.
"""

from __future__ import annotations

import logging
import time

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from . import protocol
from .protocol import Completion, Keys, State, Usage

log = logging.getLogger("sluice.worker.recovery")

ClaimedEntry = tuple[str, dict[str, str], str, int]  # (entry id, fields, stream, deliveries)


class Reclaimer:
    def __init__(
        self,
        *,
        redis_client: aioredis.Redis,
        keys: Keys,
        worker_id: str,
        claim_idle_ms: int,
        max_deliveries: int,
        interval_seconds: float = 2.0,
    ) -> None:
        self.redis = redis_client
        self.keys = keys
        self.worker_id = worker_id
        self.claim_idle_ms = claim_idle_ms
        self.max_deliveries = max_deliveries
        self.interval_seconds = interval_seconds
        self._last_run = 0.0

    async def maybe_reclaim(self, *, limit: int) -> list[ClaimedEntry]:
        """At most `limit` entries of dead workers, claimed for this worker; runs every
        `interval_seconds` at most, so the common path costs nothing."""
        if limit <= 0 or time.monotonic() - self._last_run < self.interval_seconds:
            return []
        self._last_run = time.monotonic()
        try:
            dead = await self._dead_consumers()
            claimed: list[ClaimedEntry] = []
            for consumer in dead:
                await self._rehome_affinity_stream(consumer)
                claimed += await self._claim_from(consumer, limit=limit - len(claimed))
                if len(claimed) >= limit:
                    break
            return claimed
        except ResponseError as exc:
            log.warning("reclaim skipped: %s", exc)
            return []

    async def _dead_consumers(self) -> list[str]:
        consumers = await self.redis.xinfo_consumers(self.keys.work, protocol.WORKER_GROUP)
        dead = []
        for consumer in consumers:
            name = consumer["name"]
            if name == self.worker_id or not consumer.get("pending"):
                continue
            if not await self.redis.exists(self.keys.heartbeat(name)):
                dead.append(name)
        # Affinity streams of workers that vanished without pending work on the shared stream.
        cutoff = time.time() - 60
        for name in await self.redis.zrangebyscore(self.keys.workers, "-inf", cutoff):
            if name != self.worker_id and name not in dead:
                if not await self.redis.exists(self.keys.heartbeat(name)):
                    dead.append(name)
        return dead

    async def _claim_from(self, consumer: str, *, limit: int) -> list[ClaimedEntry]:
        pending = await self.redis.xpending_range(
            self.keys.work, protocol.WORKER_GROUP, min="-", max="+", count=max(limit, 1) * 4,
            consumername=consumer, idle=self.claim_idle_ms,
        )  # fmt: skip
        claimed: list[ClaimedEntry] = []
        for entry in pending:
            if len(claimed) >= limit:
                break
            entry_id = entry["message_id"]
            entries = await self.redis.xclaim(
                self.keys.work, protocol.WORKER_GROUP, self.worker_id,
                min_idle_time=self.claim_idle_ms, message_ids=[entry_id],
            )  # fmt: skip
            if not entries:
                continue  # another worker claimed it first
            _, fields = entries[0]
            deliveries = entry["times_delivered"] + 1
            if deliveries > self.max_deliveries:
                await self._dead_letter(entry_id, fields, deliveries - 1)
                continue
            log.warning("re-running %s from dead worker %s (delivery %d)",
                        fields.get("id"), consumer, deliveries)  # fmt: skip
            claimed.append((entry_id, fields, self.keys.work, deliveries))
        return claimed

    async def _dead_letter(self, entry_id: str, fields: dict[str, str], deliveries: int) -> None:
        log.error("request %s failed %d deliveries; dead-lettered", fields.get("id"), deliveries)
        await self.redis.xadd(self.keys.dead, {**fields, "deliveries": str(deliveries)},
                              maxlen=protocol.DEAD_MAXLEN, approximate=True)  # fmt: skip
        if "id" in fields:
            from .runner import finish_request  # runner imports this module

            await finish_request(self.redis, self.keys, Completion(
                id=fields["id"], user_id=fields.get("user_id", ""),
                conversation_id=fields.get("conversation_id", ""), state=State.FAILED, text="",
                usage=Usage(), error="The answer could not be generated: its workers kept "
                "failing. Please try again.",
                prompt_tokens_estimate=int(fields.get("prompt_tokens_estimate") or 0),
                max_tokens=int(fields.get("max_tokens") or 0),
            ))  # fmt: skip
        await (
            self.redis.pipeline(transaction=False)
            .xack(self.keys.work, protocol.WORKER_GROUP, entry_id)
            .xdel(self.keys.work, entry_id)
            .execute()
        )

    async def _rehome_affinity_stream(self, consumer: str) -> None:
        """Moves work routed to a dead worker back to the shared stream, once (a lock)."""
        stream = self.keys.work_for(consumer)
        if not await self.redis.set(self.keys.reclaim_lock(consumer), self.worker_id, nx=True,
                                    ex=60):  # fmt: skip
            return
        entries = await self.redis.xrange(stream)
        for _, fields in entries:
            await self.redis.xadd(self.keys.work, fields)
        if entries:
            log.warning("moved %d entries from dead worker %s's stream", len(entries), consumer)
        await self.redis.delete(stream)
        await self.redis.zrem(self.keys.workers, consumer)
