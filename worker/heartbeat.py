"""A worker's liveness and load, as the dispatcher and the other workers see it.

Liveness is a Redis key with a TTL (three beat intervals), refreshed by the worker; the
`workers` sorted set remembers who beat when, so a worker that vanished can be found.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from contract import protocol
from contract.protocol import Keys
from worker.breaker import CircuitBreaker
from worker.engines import Engine


@dataclass
class WorkerStats:
    completed: int = 0
    failed: int = 0
    tokens: int = 0
    window_started: float = field(default_factory=time.monotonic)
    window_tokens: int = 0
    breaker: CircuitBreaker | None = None  # fed every answer's outcome

    def ended(self, request_id: str, *, failed: bool) -> None:
        """An answer ended (cancelled ones count as served: the user stopped them)."""
        if failed:
            self.failed += 1
        else:
            self.completed += 1
        if self.breaker is not None:
            self.breaker.record(request_id, failed=failed)

    def add_tokens(self, count: int) -> None:
        self.tokens += count
        self.window_tokens += count

    def tokens_per_second(self) -> float:
        elapsed = time.monotonic() - self.window_started
        rate = self.window_tokens / elapsed if elapsed > 0 else 0.0
        if elapsed > 10:  # a rolling ~10 s window
            self.window_started, self.window_tokens = time.monotonic(), 0
        return rate


async def beat(
    client,
    keys: Keys,
    *,
    worker_id: str,
    engine: Engine,
    model: str = "",
    slots: int,
    running: list[str],
    stats: WorkerStats,
    draining: bool,
    interval: float,
    prompt_window: int | None = None,
) -> dict:
    """Writes one heartbeat and returns it; `running` holds the ids of the requests this
    worker runs now."""
    health = await engine.health()
    payload = {
        "v": protocol.PROTOCOL_VERSION,  # readers tolerate fields they do not know (deploy.md)
        "worker_id": worker_id,
        "engine": engine.name,
        "model": model,
        # What a request of this model may ask for (contract/capabilities.py).
        "capabilities": sorted(getattr(engine, "capabilities", ())),
        # The web builds this model's prompts to fit it (absent: MODEL_CONTEXT_TOKENS).
        "context_tokens": _window(engine.context_tokens, prompt_window),
        "slots": slots,
        "busy": len(running),
        "free": slots - len(running),
        "running": running,
        "tokens_per_second": round(stats.tokens_per_second(), 1),
        "completed": stats.completed,
        "failed": stats.failed,
        "healthy": health.ok,
        "detail": health.detail,
        "engine_metrics": health.metrics,
        "draining": draining,
        "breaker": stats.breaker.snapshot() if stats.breaker else {"state": "closed"},
        "at_ms": protocol.now_ms(),
    }
    ttl = max(1, int(interval * 3))
    pipe = (
        client.pipeline(transaction=False)
        .set(keys.heartbeat(worker_id), json.dumps(payload), ex=ttl)
        .zadd(keys.workers, {worker_id: time.time()})
    )
    if model:  # remembered past this worker's life: "no worker now" is not "no such model"
        pipe.hset(keys.models, model, payload["at_ms"])
        pipe.expire(keys.models, protocol.METRICS_TTL_SECONDS)
    await pipe.execute()
    return payload


async def forget(client, keys: Keys, worker_id: str) -> None:
    """A worker that stops cleanly says so at once instead of waiting for its key to expire."""
    await (
        client.pipeline(transaction=False)
        .delete(keys.heartbeat(worker_id))
        .zrem(keys.workers, worker_id)
        .execute()
    )


def _window(engine_tokens: int | None, prompt_window: int | None) -> int | None:
    """The window the web builds this worker's prompts for: the engine's, or the operator's
    smaller one (an engine that cannot know its window reports the operator's)."""
    known = [w for w in (engine_tokens, prompt_window) if w]
    return min(known) if known else None
