"""Retrieval models served by workers (`python -m worker embed`): the web's side.

A request is one entry on the model's stream (contract/embed_protocol.py); its answer comes back
on this process's reply stream, which one thread reads for all the process's requests (one
blocking Redis connection, however many questions are in flight: a blocking read per question
would hold a pooled connection each). A caller waits for its answer at most its deadline.

The outcome is always clear: an answer, or EmbeddingUnavailable saying why (no live worker for
the model — known at once from the workers' beats —, the deadline passed, the model failed,
Redis away). The callers decide what that means (apps/rag/services.py: by setting, answer
without passages or refuse). Nothing here imports torch.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np
import redis
from django.conf import settings
from prometheus_client import Counter, Histogram

from contract.embed_protocol import (
    EMBED,
    EMBED_WORK_MAXLEN,
    SCORE,
    EmbedReply,
    EmbedRequest,
)
from contract.protocol import now_ms
from core.redis_client import cluster_client, get_redis, is_cluster, keys

log = logging.getLogger("sluice.rag.fleet")

# Registered on the web's /metrics registry by apps/ops/metrics.py.
REQUESTS = Counter(
    "sluice_rag_fleet_requests",
    "Embedding and scoring requests this web process sent to workers, by outcome "
    "(answered, no_worker, timeout, failed, redis).",
    ["purpose", "outcome"],
    registry=None,
)
SECONDS = Histogram(
    "sluice_rag_fleet_seconds",
    "From sending an embedding or scoring request to its answer.",
    ["purpose"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=None,
)
UNAVAILABLE = Counter(
    "sluice_rag_retrieval_unavailable",
    "Questions whose embedding could not be had, by what followed (answered without passages, "
    "refused: RAG_EMBEDDING_UNAVAILABLE).",
    ["outcome"],
    registry=None,
)
COLLECTORS = (REQUESTS, SECONDS, UNAVAILABLE)


class EmbeddingUnavailable(Exception):
    """No answer from the model's workers; the message says why."""


class _ReplyReader:
    """This process's reply stream and the thread that reads it."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.waiting: dict[str, Future] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.client = self._client()
        self.thread = threading.Thread(target=self._loop, name="sluice-embed-replies", daemon=True)
        self.thread.start()

    @staticmethod
    def _client():
        name = f"sluice-embed-replies-{os.getpid()}"
        if is_cluster():
            return cluster_client(settings.REDIS_URL, client_name=name)
        return redis.Redis.from_url(
            settings.REDIS_URL,
            decode_responses=True,
            socket_timeout=settings.REDIS_SOCKET_TIMEOUT + 2,  # past the read's 1 s block
            socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT,
            client_name=name,
        )

    def expect(self, request_id: str) -> Future:
        future: Future = Future()
        with self.lock:
            self.waiting[request_id] = future
        return future

    def forget(self, request_id: str) -> None:
        with self.lock:
            self.waiting.pop(request_id, None)

    def _loop(self) -> None:
        last = "0-0"  # the stream is this process's alone: everything on it is for us
        while not self.stopped.is_set():
            try:
                reply = self.client.xread({self.stream: last}, block=1000, count=512)
            except redis.RedisError as exc:
                log.warning("embedding replies unreadable (%s); retrying", exc)
                time.sleep(0.5)
                continue
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    last = entry_id
                    self._deliver(fields)
        self.client.close()

    def _deliver(self, fields: dict) -> None:
        try:
            answer = EmbedReply.from_fields(fields)
        except (KeyError, ValueError) as exc:
            log.warning("unreadable embedding reply: %s", exc)
            return
        with self.lock:
            future = self.waiting.pop(answer.id, None)
        if future is not None and not future.done():
            future.set_result(answer)


_readers: dict[tuple, _ReplyReader] = {}
_readers_lock = threading.Lock()
_tag = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


def _reader() -> _ReplyReader:
    # Per process (a fork gets its own), Redis and prefix (tests switch prefixes).
    ident = (os.getpid(), settings.REDIS_URL, settings.SLUICE_REDIS_PREFIX)
    reader = _readers.get(ident)
    if reader is None:
        with _readers_lock:
            reader = _readers.get(ident)
            if reader is None:
                # Another Redis or prefix (a test's): the previous reader ends within a read.
                for old in [i for i in _readers if i[0] == ident[0]]:
                    _readers.pop(old).stopped.set()
                stream = keys().embed_replies(f"{_tag}-{os.getpid()}")
                reader = _readers[ident] = _ReplyReader(stream)
    return reader


def worker_alive(model: str) -> bool:
    """Whether a worker serving `model` beat within RAG_FLEET_STALE_SECONDS."""
    beat = get_redis().hget(keys().embedders, model)
    return bool(beat) and now_ms() - int(beat) <= settings.RAG_FLEET_STALE_SECONDS * 1000


def request(
    *,
    model: str,
    texts: list[str],
    op: str = EMBED,
    query: str = "",
    purpose: str = "query",
    timeout: float | None = None,
) -> EmbedReply:
    """Sends one request to `model`'s workers and waits for its answer (at most `timeout`
    seconds: RAG_EMBED_TIMEOUT_SECONDS for a question, RAG_EMBED_BULK_TIMEOUT_SECONDS for
    ingestion). Raises EmbeddingUnavailable."""
    if timeout is None:
        bulk = purpose != "query"
        timeout = (
            settings.RAG_EMBED_BULK_TIMEOUT_SECONDS if bulk else settings.RAG_EMBED_TIMEOUT_SECONDS
        )
    # The deadline is stamped before the wait starts, so the caller never gives up before it:
    # a worker that reads the request after the caller gave up finds it expired and skips it.
    deadline_ms = now_ms() + int(timeout * 1000)
    started = time.monotonic()
    reader = _reader()
    item = EmbedRequest(
        texts=texts,
        reply_to=reader.stream,
        deadline_ms=deadline_ms,
        op=op,
        query=query,
        purpose=purpose,
    )
    future = reader.expect(item.id)
    try:
        try:
            if not worker_alive(model):
                REQUESTS.labels(purpose, "no_worker").inc()
                raise EmbeddingUnavailable(f"no worker serves the retrieval model {model!r}")
            get_redis().xadd(
                keys().embed_work(model),
                item.to_fields(),
                maxlen=EMBED_WORK_MAXLEN,
                approximate=True,
            )
        except redis.RedisError as exc:
            REQUESTS.labels(purpose, "redis").inc()
            raise EmbeddingUnavailable(
                f"the retrieval model's queue is unreachable ({exc})"
            ) from exc
        try:
            answer = future.result(timeout=max(0.0, timeout - (time.monotonic() - started)))
        except FutureTimeout:
            REQUESTS.labels(purpose, "timeout").inc()
            raise EmbeddingUnavailable(
                f"the retrieval model {model!r} did not answer within {timeout:g} s"
            ) from None
    finally:
        reader.forget(item.id)
    if answer.error:
        REQUESTS.labels(purpose, "failed").inc()
        raise EmbeddingUnavailable(f"the retrieval model {model!r} failed: {answer.error}")
    REQUESTS.labels(purpose, "answered").inc()
    SECONDS.labels(purpose).observe(time.monotonic() - started)
    return answer


def embed(texts: list[str], *, model: str, purpose: str = "query", batch: int = 64) -> np.ndarray:
    """Unit-length float32 rows from `model`'s workers; ingestion sends `batch` texts per
    request (each a batch on the worker, beside other processes' questions)."""
    parts = []
    for start in range(0, len(texts), batch):
        answer = request(model=model, texts=texts[start : start + batch], purpose=purpose)
        parts.append(answer.vectors)
    return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)


def score(query: str, texts: list[str], *, model: str) -> list[float]:
    """A reranker's score of each passage for `query`, from `model`'s workers."""
    return request(model=model, texts=texts, op=SCORE, query=query).scores or []
