"""A worker that serves a retrieval model (an embedder, or a reranker with --kind score) to every
web process over Redis Streams, as chat work is served (`python -m worker embed`: embed_main.py).

Web processes add requests to the model's stream (`embed-work:{model}`); each worker serving
the model reads with XREADGROUP what has gathered since its last batch (COUNT = --max-entries),
runs the texts of all those requests through the model as one batch (people's questions first,
then ingestion's texts, at most --max-batch texts a call), and answers each request on the
stream its process named. So a hundred people asking at once cost a few batches on the worker,
not a hundred model calls on the web. A request whose deadline passed is acknowledged
unanswered; one delivered to a worker that died is claimed by another after --claim-idle-ms.
Liveness: a key with a TTL of three beats, and the model's time in the `embedders` hash, which
the web reads to fail at once, instead of at its deadline, when no worker serves the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import redis.asyncio as aioredis
from prometheus_client import Counter, Histogram
from redis.exceptions import RedisError, ResponseError

from contract.embed_protocol import (
    EMBED_GROUP,
    REPLIES_MAXLEN,
    REPLIES_TTL_SECONDS,
    SCORE,
    EmbedReply,
    EmbedRequest,
)
from contract.protocol import Keys, now_ms
from worker import metrics
from worker.runner import default_worker_id

log = logging.getLogger("sluice.worker.embed")

BATCHES = Histogram(
    "sluice_embed_batch_texts",
    "Texts per model call on this embedding worker.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
    registry=metrics.REGISTRY,
)
REQUESTS = Counter(
    "sluice_embed_requests",
    "Embedding and scoring requests this worker ended, by outcome (answered, expired, failed).",
    ["outcome"],
    registry=metrics.REGISTRY,
)
SECONDS = Histogram(
    "sluice_embed_call_seconds",
    "Time of one model call (a batch).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=metrics.REGISTRY,
)


class EmbedWorker:
    """Serves one retrieval model from its stream until stopped.

    Args:
        redis_client: an asyncio Redis client with decode_responses=True.
        embedder: a started model (worker/engines/embedders.py).
        keys: stream and key names.
        model: the name web processes ask for (a corpus's `embedding_model`).
        worker_id: consumer name, unique per worker.
        max_entries: requests read at once (each may hold many texts).
        max_batch: texts per model call.
        heartbeat_interval: seconds between beats; the liveness key lives three.
        claim_idle_ms: a request delivered to a worker that has not answered it for this long
            (it died) is taken over.
        read_block_ms: how long one read waits; a stop is noticed within this.
    """

    def __init__(
        self,
        *,
        redis_client: aioredis.Redis,
        embedder,
        keys: Keys,
        model: str,
        worker_id: str | None = None,
        max_entries: int = 128,
        max_batch: int = 256,
        heartbeat_interval: float = 2.0,
        claim_idle_ms: int = 10_000,
        read_block_ms: int = 1000,
    ) -> None:
        self.redis = redis_client
        self.embedder = embedder
        self.keys = keys
        self.model = model
        self.worker_id = worker_id or default_worker_id()
        self.stream = keys.embed_work(model)
        self.max_entries = max_entries
        self.max_batch = max_batch
        self.heartbeat_interval = heartbeat_interval
        self.claim_idle_ms = claim_idle_ms
        self.read_block_ms = read_block_ms
        self.batches = 0
        self.texts = 0
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def run(self) -> None:
        await self._ensure_group()
        beating = asyncio.create_task(self._heartbeat_loop(), name="embed-heartbeat")
        log.info(
            "embedding worker %s ready: model %r (%s, %s dimensions)",
            self.worker_id,
            self.model,
            self.embedder.kind,
            self.embedder.dimensions or "-",
        )
        try:
            while not self._stopping.is_set():
                try:
                    entries = await self._claimed() or await self._read()
                    if entries:
                        await self.serve(entries)
                except RedisError as exc:
                    log.warning("embedding worker: Redis unavailable (%s); retrying", exc)
                    await asyncio.sleep(0.5)
                    with contextlib.suppress(RedisError):
                        await self._ensure_group()
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
            with contextlib.suppress(RedisError):
                await self.redis.delete(self.keys.embedder(self.worker_id))
            log.info("embedding worker %s stopped", self.worker_id)

    async def _ensure_group(self) -> None:
        try:
            await self.redis.xgroup_create(self.stream, EMBED_GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _read(self) -> list[tuple[str, dict]]:
        try:
            reply = await self.redis.xreadgroup(
                EMBED_GROUP,
                self.worker_id,
                {self.stream: ">"},
                count=self.max_entries,
                block=self.read_block_ms,
            )
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self._ensure_group()  # the stream was deleted (a flush): start again
            return []
        return [entry for _, entries in reply or [] for entry in entries]

    async def _claimed(self) -> list[tuple[str, dict]]:
        """Requests a dead worker was delivered and never answered (checked once a beat)."""
        now = asyncio.get_running_loop().time()
        if now < getattr(self, "_next_claim", 0.0):
            return []
        self._next_claim = now + self.heartbeat_interval
        reply = await self.redis.xautoclaim(
            self.stream, EMBED_GROUP, self.worker_id, self.claim_idle_ms, "0-0", count=64
        )
        return [entry for entry in reply[1] if entry and entry[1]]

    async def serve(self, entries: list[tuple[str, dict]]) -> None:
        """Answers the requests in `entries` (entry id, fields): queries first, in batches."""
        at = now_ms()
        requests: list[tuple[str, EmbedRequest]] = []
        done: list[str] = []
        for entry_id, fields in entries:
            try:
                request = EmbedRequest.from_fields(fields)
            except (KeyError, ValueError, TypeError) as exc:
                await self._dead(entry_id, fields, str(exc))
                done.append(entry_id)
                continue
            if request.expired(at):
                REQUESTS.labels("expired").inc()
                done.append(entry_id)
            else:
                requests.append((entry_id, request))
        requests.sort(key=lambda pair: pair[1].purpose != "query")  # stable: queries first
        replies: list[tuple[str, EmbedReply]] = []
        for group in self._batches(requests):
            replies += await self._run(group)
        pipe = self.redis.pipeline(transaction=False)
        for reply_to, reply in replies:
            pipe.xadd(reply_to, reply.to_fields(), maxlen=REPLIES_MAXLEN, approximate=True)
            pipe.expire(reply_to, REPLIES_TTL_SECONDS)
        done += [entry_id for entry_id, _ in requests]
        if done:
            pipe.xack(self.stream, EMBED_GROUP, *done)
            pipe.xdel(self.stream, *done)
        await pipe.execute()

    def _batches(self, requests):
        group, size = [], 0
        for entry_id, request in requests:
            if group and (size + len(request.texts) > self.max_batch or request.op == SCORE):
                yield group
                group, size = [], 0
            group.append((entry_id, request))
            size += len(request.texts)
            if request.op == SCORE:  # one question per scoring call
                yield group
                group, size = [], 0
        if group:
            yield group

    async def _run(self, group) -> list[tuple[str, EmbedReply]]:
        texts = [text for _, request in group for text in request.texts]
        started = asyncio.get_running_loop().time()
        try:
            if group[0][1].op == SCORE:
                scores = await self.embedder.score(group[0][1].query, texts)
                out = [EmbedReply(group[0][1].id, self.model, scores=scores)]
            else:
                vectors = await self.embedder.embed(texts) if texts else None
                out, offset = [], 0
                for _, request in group:
                    rows = vectors[offset : offset + len(request.texts)] if texts else None
                    out.append(EmbedReply(request.id, self.model, vectors=rows))
                    offset += len(request.texts)
            REQUESTS.labels("answered").inc(len(group))
        except Exception as exc:  # the model's failure is each request's answer, not a crash
            log.exception("embedding batch of %d texts failed", len(texts))
            out = [
                EmbedReply(r.id, self.model, error=f"{type(exc).__name__}: {exc}") for _, r in group
            ]
            REQUESTS.labels("failed").inc(len(group))
        SECONDS.observe(asyncio.get_running_loop().time() - started)
        BATCHES.observe(len(texts))
        self.batches += 1
        self.texts += len(texts)
        for reply in out:
            reply.worker = self.worker_id
        return [(request.reply_to, reply) for (_, request), reply in zip(group, out, strict=True)]

    async def _dead(self, entry_id: str, fields: dict, reason: str) -> None:
        log.warning("unreadable embedding request %s: %s", entry_id, reason)
        await self.redis.xadd(
            self.keys.dead,
            {"stream": self.stream, "entry": entry_id, "reason": reason, **fields},
            maxlen=10_000,
            approximate=True,
        )

    async def beat(self) -> None:
        beat = {
            "worker_id": self.worker_id,
            "model": self.model,
            "kind": self.embedder.kind,
            "dimensions": self.embedder.dimensions,
            "batches": self.batches,
            "texts": self.texts,
            "at_ms": now_ms(),
        }
        ttl_ms = int(self.heartbeat_interval * 3000)
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.keys.embedder(self.worker_id), json.dumps(beat), px=ttl_ms)
        pipe.hset(self.keys.embedders, self.model, beat["at_ms"])
        await pipe.execute()

    async def _heartbeat_loop(self) -> None:
        while True:
            with contextlib.suppress(RedisError):
                await self.beat()
            await asyncio.sleep(self.heartbeat_interval)
