"""The worker: pulls work items from the work streams as it frees slots and runs each one as an
attempt (`attempt.py`).

Pull-based load balancing: a worker reads only as many entries as it has free slots (XREADGROUP
COUNT = free slots), so an idle worker is never starved while a busy one queues. The read loop
outlives Redis trouble: it waits out a restart, recreates a consumer group that vanished, and
re-runs work delivered to it that it is no longer running (`recovery.py`). A circuit breaker
(`breaker.py`) stops the reads while this worker's answers keep failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from contract import protocol, transitions
from contract.cancelling import cancel_and_wait, raise_if_cancelled
from contract.protocol import Keys
from worker import heartbeat, legacy_keys
from worker.attempt import TRANSIENT, Attempts
from worker.batching import CommandBatcher
from worker.breaker import BreakerSettings, CircuitBreaker
from worker.engines import Engine
from worker.heartbeat import WorkerStats
from worker.isolation import Isolation
from worker.output import OutputWriter
from worker.recovery import Reclaimer

log = logging.getLogger("sluice.worker")

CHECK_SECONDS = 0.2  # how often running answers look for Stop and for a lost claim


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Worker:
    """Runs one engine against the work streams until stopped.

    Args:
        redis_client: an asyncio Redis client with decode_responses=True.
        engine: a started engine.
        keys: stream and key names (the prefix isolates deployments and tests).
        worker_id: this worker's consumer name; unique per process.
        model: the model name this worker serves (announced in its heartbeat): it reads that
            model's shared stream, besides its own affinity stream and the stream of work
            that names no model. "": it serves only the latter.
        slots: concurrent answers; defaults to the engine's capacity.
        batch_interval: an answer's tokens are written to its output stream about this often
            (the first token at once); all answers on one clock (`output.OutputWriter`).
        batch_busy_interval: ... and this often when many answers run (OutputWriter).
        batch_chars: an answer's gathered text is written early once it is this long.
        heartbeat_interval: seconds between heartbeats; the key lives three intervals.
        claim_idle_ms: work pending this long on a worker whose heartbeat is gone is re-run.
        max_attempts: a request started this many times is dead-lettered instead of run again.
        grace_seconds: on stop, running answers get this long before they go back to the
            shared stream for another worker.
        answer_timeout: seconds one answer may take before it fails (a hung engine).
        stop_loops: cut an answer that repeats itself (finish reason `loop`); only where the
            operator asked for it (the bundled demo model, by default).
        read_block_ms: how long one read waits for work; a stop is noticed within this.
        breaker: when this worker's answers fail too often, it stops taking work for a while.
        prompt_window: tokens the web may build prompts for, below the engine's own window.
    """

    def __init__(
        self,
        *,
        redis_client: aioredis.Redis,
        engine: Engine,
        keys: Keys,
        worker_id: str | None = None,
        model: str = "",
        slots: int | None = None,
        batch_interval: float = 0.03,
        batch_busy_interval: float | None = None,
        batch_chars: int = 1024,
        heartbeat_interval: float = 2.0,
        claim_idle_ms: int = 10_000,
        max_attempts: int = 3,
        grace_seconds: float = 30.0,
        answer_timeout: float = 600.0,
        stop_loops: bool = False,
        read_block_ms: int = 1000,
        breaker: BreakerSettings | None = None,
        prompt_window: int | None = None,
    ) -> None:
        self.redis = redis_client
        self.engine = engine
        self.keys = keys
        self.worker_id = worker_id or default_worker_id()
        self.model = model
        self.slots = slots or engine.capacity
        self.heartbeat_interval = heartbeat_interval
        self.prompt_window = prompt_window
        self.grace_seconds = grace_seconds
        self.read_block_ms = read_block_ms
        self.breaker = CircuitBreaker(breaker)
        self.breaker.on_open = self._breaker_opened
        self.stats = WorkerStats(breaker=self.breaker)
        self._background: set[asyncio.Task] = set()
        self.last_beat: dict | None = None  # what the metrics endpoint's gauges read
        self.batcher = CommandBatcher(redis_client)
        self.output = OutputWriter(
            self.batcher,
            keys,
            interval=batch_interval,
            busy_interval=batch_busy_interval,
            max_chars=batch_chars,
            check_interval=CHECK_SECONDS,
        )
        self.isolation = Isolation()  # suspect work runs alone (isolation.py)
        self.attempts = Attempts(
            batcher=self.batcher,
            keys=keys,
            engine=engine,
            output=self.output,
            worker_id=self.worker_id,
            stats=self.stats,
            max_attempts=max_attempts,
            answer_timeout=answer_timeout,
            stop_loops=stop_loops,
            isolation=self.isolation,
        )
        # Its own affinity stream first, then its model's, then work naming no model.
        self.shared_streams = tuple(dict.fromkeys((keys.work_for_model(model), keys.work)))
        self.streams = (self.keys.work_for(self.worker_id), *self.shared_streams)
        self._free = asyncio.BoundedSemaphore(self.slots)
        # (stream, entry id) → (task, request id): entry ids are unique per stream only, and the
        # dispatcher's one MULTI often gives entries on two streams the same id.
        self._tasks: dict[tuple[str, str], tuple[asyncio.Task, str]] = {}
        self._stopping = asyncio.Event()
        self.reclaimer = Reclaimer(
            redis_client=redis_client,
            keys=keys,
            worker_id=self.worker_id,
            claim_idle_ms=claim_idle_ms,
            interval_seconds=heartbeat_interval,
            running=self._tasks,
            shared_streams=self.shared_streams,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop reading new work; running answers get the grace period (see run)."""
        self._stopping.set()

    async def run(self) -> None:
        await self.attempts.retrying(self._ensure_groups)
        await legacy_keys.move_legacy_entries(self.redis, self.keys)  # once, after an upgrade
        self._beating = True
        beating = asyncio.create_task(self._heartbeat_loop(), name="heartbeat")
        log.info(
            "worker %s ready: engine %s, model %r, %d slots",
            self.worker_id,
            self.engine.name,
            self.model,
            self.slots,
        )
        try:
            await self._read_loop()
        finally:
            await self._hand_back_backlog(announce=True)
            await self._drain()
            self._beating = False  # ends the loop even if a Redis call swallowed the cancel
            await cancel_and_wait(beating)
            await self.output.stop()
            await self._leave()
            await self.batcher.close()
            log.info("worker %s stopped", self.worker_id)

    async def _drain(self) -> None:
        if not self._tasks:
            return
        log.info("waiting up to %.0fs for %d running answers", self.grace_seconds, len(self._tasks))
        tasks = [task for task, _ in self._tasks.values()]
        _, pending = await asyncio.wait(tasks, timeout=self.grace_seconds)
        for task in pending:
            task.cancel()  # each gives its work item back to the shared stream
        if pending:
            await asyncio.wait(pending)

    async def _hand_back_backlog(self, *, announce: bool = False) -> None:
        """Work routed to this worker that it has not read goes back to the shared stream at
        once (it stops, or its breaker opened): nobody waits for a drain or a claim timeout.
        With `announce`, a heartbeat first says it is draining, so no more is routed here."""
        try:
            if announce:
                with contextlib.suppress(Exception):  # a missed beat only delays the news
                    await self._beat()
            await self.reclaimer.rehome(self.worker_id)
        except RedisError as exc:  # _leave tries again; a dead worker's backlog is rehomed
            log.warning("could not hand back routed work: %s", exc)

    def _breaker_opened(self) -> None:
        log.warning(
            "worker %s: circuit breaker open (answers failing); out of routing for %.0f s",
            self.worker_id,
            self.breaker.settings.cooldown_seconds,
        )
        task = asyncio.create_task(self._hand_back_backlog(announce=True))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _leave(self) -> None:
        """Work routed to this worker goes back to the shared stream, and the worker says it
        has gone, so nothing waits for it."""
        try:
            await self.reclaimer.rehome(self.worker_id)
            await heartbeat.forget(self.redis, self.keys, self.worker_id)
            for stream in self.streams:
                # Only with nothing pending: deleting a consumer drops its pending entries.
                pending = await self.redis.xpending_range(
                    stream,
                    protocol.WORKER_GROUP,
                    min="-",
                    max="+",
                    count=1,
                    consumername=self.worker_id,
                )
                if not pending:
                    await self.redis.xgroup_delconsumer(
                        stream, protocol.WORKER_GROUP, self.worker_id
                    )
        except RedisError as exc:  # the others find this worker gone by its heartbeat
            log.warning("could not leave cleanly: %s", exc)

    async def _ensure_groups(self) -> None:
        pipe = self.redis.pipeline(transaction=False)
        transitions.ensure_groups(pipe, [(s, protocol.WORKER_GROUP) for s in self.streams])
        transitions.check_groups(await pipe.execute(raise_on_error=False))

    # -- reading work ------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        delay = 0.2
        while not self._stopping.is_set():
            raise_if_cancelled()  # one a Redis write swallowed (cancelling.py)
            if not await self._until(self.isolation.clear):  # a suspect runs alone
                break
            permits = await self._acquire_free_slots()
            if not permits:  # stopped while every slot was busy
                break
            started = 0
            try:
                if self._stopping.is_set():  # stopped while waiting for a slot
                    break
                allowed = self.breaker.allowance(permits)
                if not allowed:  # out of routing: wait for the cool-down (or the probe's end)
                    await self._pause(self.breaker.wait_seconds() or CHECK_SECONDS)
                    continue
                for entry_id, fields, stream in await self.reclaimer.maybe_reclaim(limit=allowed):
                    self._start(entry_id, fields, stream)
                    started += 1
                if started < allowed:
                    started += await self._read(allowed - started)
                delay = 0.2
            except TRANSIENT as exc:
                log.warning("Redis unavailable (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            except RedisError as exc:
                if not transitions.is_missing_group(exc):
                    raise
                # The stream or group vanished (Redis restarted empty, or someone deleted
                # it): recreate it and go on reading.
                log.warning("work stream group missing (%s); recreating it", exc)
                await self._ensure_groups()
            finally:
                for _ in range(permits - started):  # slots nobody took
                    self._free.release()

    async def _read(self, count: int) -> int:
        response = await self.redis.xreadgroup(
            protocol.WORKER_GROUP,
            self.worker_id,
            dict.fromkeys(self.streams, ">"),
            count=count,
            block=self.read_block_ms,
        )
        entries = [(stream, entry) for stream, batch in response or [] for entry in batch]
        # Read just as the stop came, or as the breaker opened during the blocking read:
        # another worker runs them, not this draining (or failing) one.
        keep = 0 if self._stopping.is_set() else self.breaker.allowance(len(entries))
        if len(entries) > keep:
            returned, entries = entries[keep:], entries[:keep]

            def give_back(pipe) -> None:
                for stream, (entry_id, fields) in returned:
                    transitions.work_returned(pipe, self.keys, stream, entry_id, fields)

            await self.batcher.call(give_back)
            log.info(
                "returned %d work items just read (%s)",
                len(returned),
                "stopping" if self._stopping.is_set() else "breaker open",
            )
        for stream, (entry_id, fields) in entries:
            self._start(entry_id, fields, stream, fresh=protocol.RETURNED not in fields)
        return len(entries)

    async def _pause(self, seconds: float) -> None:
        """Sleeps up to `seconds` (at most one read's block), waking at once on a stop."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(seconds, self.read_block_ms / 1000)):
                await self._stopping.wait()

    async def _until(self, event: asyncio.Event) -> bool:
        """Waits for `event`; False when the worker stops first."""
        if event.is_set():
            return True
        stop = asyncio.ensure_future(self._stopping.wait())
        wait = asyncio.ensure_future(event.wait())
        await asyncio.wait((stop, wait), return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        wait.cancel()
        return event.is_set()

    async def _acquire_free_slots(self) -> int:
        """Waits for one free slot, then takes every other free one: the read's COUNT. 0 when
        the worker stops first (a full worker must not wait for a slot to begin its drain)."""
        acquire = asyncio.ensure_future(self._free.acquire())
        stop = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait((acquire, stop), return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not acquire.done():
            acquire.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await acquire
            if not acquire.cancelled():  # won the race after all: give the slot back
                self._free.release()
            return 0
        permits = 1
        while not self._free.locked():
            await self._free.acquire()  # returns at once: the semaphore is not locked
            permits += 1
        return permits

    def _start(
        self, entry_id: str, fields: dict[str, str], stream: str, *, fresh: bool = False
    ) -> None:
        """Runs one entry in its own task; the task owns one slot permit and releases it.
        `fresh`: its first delivery (not reclaimed, not given back: Attempts.run)."""
        task = asyncio.create_task(self.attempts.run(entry_id, fields, stream, fresh=fresh))
        self._tasks[(stream, entry_id)] = (task, fields.get("id", ""))
        self.isolation.task_started()
        self.breaker.started(fields.get("id", ""))

        def done(finished: asyncio.Task) -> None:
            self._tasks.pop((stream, entry_id), None)
            self._free.release()
            self.isolation.task_ended()
            if not finished.cancelled() and finished.exception() is not None:
                # Redis stayed away past the attempt's patience: the entry stays pending
                # and is re-run by this worker once Redis is back (recovery.py).
                log.error("request %s stopped: %r", fields.get("id"), finished.exception())

        task.add_done_callback(done)

    # -- liveness ------------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while self._beating:
            raise_if_cancelled()
            try:
                await self._beat()
            except Exception as exc:  # keep beating through transient Redis errors
                log.warning("heartbeat failed: %s", exc)
            await asyncio.sleep(self.heartbeat_interval)

    async def _beat(self) -> None:
        self.last_beat = await heartbeat.beat(
            self.redis,
            self.keys,
            worker_id=self.worker_id,
            engine=self.engine,
            model=self.model,
            slots=self.slots,
            running=[rid for _, rid in self._tasks.values()],
            stats=self.stats,
            draining=self._stopping.is_set(),
            interval=self.heartbeat_interval,
            prompt_window=self.prompt_window,
        )
