"""The worker: pulls generations from the work streams as it frees slots and streams the answers.

Pull-based load balancing: a worker reads only as many entries as it has free slots (XREADGROUP
COUNT = free slots), so an idle worker is never starved while a busy one queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from dataclasses import asdict, dataclass, field

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from . import protocol
from .batching import CommandBatcher
from .engines import Engine, GenerationRequest
from .output import OutputWriter, queue_emit
from .protocol import Completion, Keys, State, Usage, WorkItem
from .recovery import Reclaimer

log = logging.getLogger("sluice.worker")

CANCEL_CHECK_SECONDS = 0.2


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class WorkerStats:
    busy: int = 0
    completed: int = 0
    failed: int = 0
    tokens: int = 0
    window_started: float = field(default_factory=time.monotonic)
    window_tokens: int = 0

    def tokens_per_second(self) -> float:
        elapsed = time.monotonic() - self.window_started
        rate = self.window_tokens / elapsed if elapsed > 0 else 0.0
        if elapsed > 10:  # a rolling ~10 s window
            self.window_started, self.window_tokens = time.monotonic(), 0
        return rate


class Worker:
    """Runs one engine against the work streams until stopped.

    Args:
        redis_client: an asyncio Redis client with decode_responses=True.
        engine: a started engine.
        keys: stream and key names (the prefix isolates deployments and tests).
        worker_id: this worker's consumer name; unique per process.
        slots: concurrent generations; defaults to the engine's capacity.
        batch_interval: an answer's tokens are written to its output stream about this often
            (the first token at once); all answers on one clock (`output.OutputWriter`).
        batch_chars: an answer's gathered text is written early once it is this long.
        heartbeat_interval: seconds between heartbeats; the key lives three intervals.
        claim_idle_ms: work pending this long on a worker whose heartbeat is gone is re-run.
        max_deliveries: after this many deliveries a work item goes to the dead-letter stream.
        grace_seconds: on stop, running generations get this long before they are cancelled.
    """

    def __init__(
        self,
        *,
        redis_client: aioredis.Redis,
        engine: Engine,
        keys: Keys,
        worker_id: str | None = None,
        slots: int | None = None,
        batch_interval: float = 0.03,
        batch_chars: int = 64,
        heartbeat_interval: float = 2.0,
        claim_idle_ms: int = 10_000,
        max_deliveries: int = 3,
        grace_seconds: float = 30.0,
    ) -> None:
        self.redis = redis_client
        self.engine = engine
        self.keys = keys
        self.worker_id = worker_id or default_worker_id()
        self.slots = slots or engine.capacity
        self.heartbeat_interval = heartbeat_interval
        self.grace_seconds = grace_seconds
        self.stats = WorkerStats()
        self.batcher = CommandBatcher(redis_client)
        self.output = OutputWriter(self.batcher, keys, interval=batch_interval,
                                   max_chars=batch_chars,
                                   cancel_interval=CANCEL_CHECK_SECONDS)  # fmt: skip
        self._free = asyncio.BoundedSemaphore(self.slots)
        self._tasks: dict[str, asyncio.Task] = {}
        self._stopping = asyncio.Event()
        self.reclaimer = Reclaimer(
            redis_client=redis_client,
            keys=keys,
            worker_id=self.worker_id,
            claim_idle_ms=claim_idle_ms,
            max_deliveries=max_deliveries,
            interval_seconds=heartbeat_interval,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop reading new work; running generations get the grace period (see run)."""
        self._stopping.set()

    async def run(self) -> None:
        await self._ensure_groups()
        heartbeat = asyncio.create_task(self._heartbeat_loop(), name="heartbeat")
        log.info("worker %s ready: engine %s, %d slots", self.worker_id, self.engine.name,
                 self.slots)  # fmt: skip
        try:
            await self._read_loop()
        finally:
            await self._drain()
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            await self.output.stop()
            await self.batcher.close()
            await self.redis.delete(self.keys.heartbeat(self.worker_id))
            await self.redis.zrem(self.keys.workers, self.worker_id)
            # Nothing left pending here: remove this consumer so reclaimers skip it.
            for stream in (self.keys.work, self.keys.work_for(self.worker_id)):
                with contextlib.suppress(ResponseError):
                    await self.redis.xgroup_delconsumer(stream, protocol.WORKER_GROUP,
                                                        self.worker_id)  # fmt: skip
            log.info("worker %s stopped", self.worker_id)

    async def _drain(self) -> None:
        if not self._tasks:
            return
        log.info("waiting up to %.0fs for %d running generations", self.grace_seconds,
                 len(self._tasks))  # fmt: skip
        _, pending = await asyncio.wait(list(self._tasks.values()), timeout=self.grace_seconds)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def _ensure_groups(self) -> None:
        for stream in (self.keys.work, self.keys.work_for(self.worker_id)):
            try:
                await self.redis.xgroup_create(stream, protocol.WORKER_GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    # -- reading work ------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        streams = {self.keys.work_for(self.worker_id): ">", self.keys.work: ">"}
        while not self._stopping.is_set():
            permits = await self._acquire_free_slots()
            started = 0
            if self._stopping.is_set():  # stopped while waiting for a slot: read nothing more
                for _ in range(permits):
                    self._free.release()
                break
            try:
                for entry_id, fields, stream, deliveries in await self.reclaimer.maybe_reclaim(
                    limit=permits
                ):
                    self._start(entry_id, fields, stream=stream, attempt=deliveries)
                    started += 1
                if started < permits:
                    response = await self.redis.xreadgroup(
                        protocol.WORKER_GROUP, self.worker_id, streams,
                        count=permits - started, block=1000,
                    )  # fmt: skip
                    for stream, entries in response or []:
                        for entry_id, fields in entries:
                            self._start(entry_id, fields, stream=stream, attempt=1)
                            started += 1
            except RedisConnectionError as exc:
                log.warning("Redis unavailable (%s); retrying in 1s", exc)
                await asyncio.sleep(1)
            finally:
                for _ in range(permits - started):  # slots nobody took
                    self._free.release()

    async def _acquire_free_slots(self) -> int:
        """Waits for one free slot, then takes every other free one: the read's COUNT."""
        await self._free.acquire()
        permits = 1
        while not self._free.locked():
            await self._free.acquire()  # returns at once: the semaphore is not locked
            permits += 1
        return permits

    def _free_slots(self) -> int:
        return self.slots - len(self._tasks)

    def _start(self, entry_id: str, fields: dict[str, str], *, stream: str, attempt: int) -> None:
        """Runs one entry in its own task; the task owns one slot permit and releases it."""
        task = asyncio.create_task(self._run_one(entry_id, fields, stream, attempt))
        self._tasks[entry_id] = task

        def done(_task: asyncio.Task) -> None:
            self._tasks.pop(entry_id, None)
            self._free.release()

        task.add_done_callback(done)

    # -- running one generation ----------------------------------------------------------------

    async def _run_one(self, entry_id: str, fields: dict[str, str], stream: str, attempt: int):
        try:
            item = WorkItem.from_fields(fields)
        except (KeyError, ValueError) as exc:
            log.error("dropping malformed work entry %s: %s", entry_id, exc)
            await self.redis.xadd(self.keys.dead, {**fields, "error": str(exc)},
                                  maxlen=protocol.DEAD_MAXLEN, approximate=True)  # fmt: skip
            await self.redis.xack(stream, protocol.WORKER_GROUP, entry_id)
            return
        completion = await self._generate(item, attempt)
        await self._finish(item, completion)

        # Acknowledged only after the final event and the completion record are written:
        # a crash before this line leaves the entry pending, to be reclaimed and re-run.
        # Deleted too: the work streams hold only work not yet finished.
        def acknowledge(pipe) -> None:
            pipe.xack(stream, protocol.WORKER_GROUP, entry_id)
            pipe.xdel(stream, entry_id)

        await self.batcher.call(acknowledge)

    async def _generate(self, item: WorkItem, attempt: int) -> Completion:
        out_key = self.keys.output(item.id)
        completion = Completion(
            id=item.id, user_id=item.user_id, conversation_id=item.conversation_id,
            state=State.DONE, text="", usage=Usage(), worker_id=self.worker_id,
            prompt_tokens_estimate=item.prompt_tokens_estimate, max_tokens=item.max_tokens,
        )  # fmt: skip
        if await self._cancelled(item.id):
            completion.state = State.CANCELLED
            return completion

        def announce_start(pipe) -> None:
            self._queue_state(pipe, item.id, State.STREAMING, worker=self.worker_id)
            queue_emit(pipe, out_key, protocol.start_event(attempt=attempt,
                                                           worker_id=self.worker_id))  # fmt: skip
            pipe.expire(out_key, protocol.OUTPUT_TTL_SECONDS)

        await self.batcher.call(announce_start)
        self.stats.busy += 1
        started = time.perf_counter()
        parts: list[str] = []
        answer = self.output.open(item.id)
        request = GenerationRequest(
            id=item.id, messages=item.messages, max_tokens=item.max_tokens,
            temperature=item.temperature,
        )  # fmt: skip
        try:
            async for output in self.engine.generate(request):
                completion.usage.prompt_tokens = output.prompt_tokens
                completion.usage.completion_tokens = output.completion_tokens
                if not output.text:
                    continue
                if completion.usage.ttft_ms is None:
                    completion.usage.ttft_ms = round((time.perf_counter() - started) * 1000, 2)
                parts.append(output.text)
                # The first token is written at once, the rest on the output writer's clock.
                await self.output.add(answer, output.text)
                if answer.cancelled:  # the writer checks for Stop every few batches
                    await self.engine.abort(item.id)
                    completion.state = State.CANCELLED
                    break
        except asyncio.CancelledError:
            await self.engine.abort(item.id)
            completion.state = State.FAILED
            completion.error = "The worker shut down before the answer was finished."
        except Exception as exc:  # an engine failure fails this request, not the worker
            log.exception("generation %s failed", item.id)
            completion.state = State.FAILED
            completion.error = f"The model failed: {exc.__class__.__name__}"
        finally:
            self.stats.busy -= 1
        await self.output.close(answer)
        completion.text = "".join(parts)
        completion.usage.duration_ms = round((time.perf_counter() - started) * 1000, 2)
        self.stats.tokens += completion.usage.completion_tokens
        self.stats.window_tokens += completion.usage.completion_tokens
        return completion

    async def _finish(self, item: WorkItem, completion: Completion) -> None:
        if completion.state == State.FAILED:
            self.stats.failed += 1
        else:
            self.stats.completed += 1
        await self.batcher.call(lambda p: queue_finish(p, self.keys, completion))

    async def _cancelled(self, request_id: str) -> bool:
        return bool(await self.batcher.call(lambda p: p.exists(self.keys.cancel(request_id))))

    def _queue_state(self, pipe, request_id: str, state: State, **fields: str) -> None:
        key = self.keys.request(request_id)
        pipe.hset(key, mapping={"state": state, "updated_ms": protocol.now_ms(), **fields})
        pipe.expire(key, protocol.REQUEST_TTL_SECONDS)

    # -- liveness ------------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            try:
                await self._beat()
            except Exception as exc:  # keep beating through transient Redis errors
                log.warning("heartbeat failed: %s", exc)
            await asyncio.sleep(self.heartbeat_interval)

    async def _beat(self) -> None:
        health = await self.engine.health()
        payload = {
            "worker_id": self.worker_id,
            "engine": self.engine.name,
            "slots": self.slots,
            "busy": len(self._tasks),
            "free": self._free_slots(),
            "tokens_per_second": round(self.stats.tokens_per_second(), 1),
            "completed": self.stats.completed,
            "failed": self.stats.failed,
            "healthy": health.ok,
            "detail": health.detail,
            "engine_metrics": health.metrics,
            "draining": self._stopping.is_set(),
            "at_ms": protocol.now_ms(),
        }
        ttl = max(1, int(self.heartbeat_interval * 3))
        await (
            self.redis.pipeline(transaction=False)
            .set(self.keys.heartbeat(self.worker_id), json.dumps(payload), ex=ttl)
            .zadd(self.keys.workers, {self.worker_id: time.time()})
            .execute()
        )


def queue_finish(pipe, keys: Keys, completion: Completion) -> None:
    """Queues the final event for readers, the request's end state and the completion record
    the recorder stores in PostgreSQL, in that order."""
    out_key = keys.output(completion.id)
    request_key = keys.request(completion.id)
    pipe.xadd(out_key, protocol.final_event(completion),
              maxlen=protocol.OUTPUT_MAXLEN, approximate=True)  # fmt: skip
    pipe.expire(out_key, protocol.OUTPUT_TTL_SECONDS)
    pipe.hset(request_key, mapping={
        "state": completion.state, "updated_ms": protocol.now_ms(), "error": completion.error,
        "usage": json.dumps(asdict(completion.usage)),
    })  # fmt: skip
    pipe.expire(request_key, protocol.REQUEST_TTL_SECONDS)
    pipe.xadd(keys.done, completion.to_fields(), maxlen=protocol.DONE_MAXLEN, approximate=True)


async def finish_request(redis_client: aioredis.Redis, keys: Keys, completion: Completion) -> None:
    """Writes what `queue_finish` queues. Shared by workers and the dead-letter path."""
    pipe = redis_client.pipeline(transaction=False)
    queue_finish(pipe, keys, completion)
    await pipe.execute()
