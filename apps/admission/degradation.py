"""Degradation levels: how much the service sheds when it is overloaded.

The dispatcher computes the level from three signals, each as a ratio of its threshold (the
backlog, the host's CPU over the last minute, the workers' KV-cache / GPU memory use), and
publishes it in Redis with its effects, every few seconds, with the fleet's gauges. Web processes
read it (see selectors.degradation_get):

  level 0  normal
  level 1  answers capped at `capped_max_tokens`          (cap_max_tokens_level, default 1)
  level 2  also: expensive retrieval steps are skipped     (skip_retrieval_level, default 2)
  level 3  also: new requests of the lowest plan rejected  (reject_lowest_plan_level, default 3)
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

import redis

from apps.admission.models import DegradationSettings
from worker.protocol import METRICS_TTL_SECONDS, Keys

PUBLISHED_TTL_SECONDS = 30  # a dispatcher that stops publishing stops degrading the service


@dataclass
class Degradation:
    level: int = 0
    cap_max_tokens: int | None = None
    skip_retrieval: bool = False
    reject_lowest_plan: bool = False
    retry_after: int = 60
    signals: dict[str, float] = field(default_factory=dict)
    forced: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str | None) -> Degradation:
        if not raw:
            return cls()
        try:
            return cls(**json.loads(raw))
        except (TypeError, ValueError):
            return cls()


def host_cpu_percent() -> float:
    """The 1-minute load average as a share of the cores: "CPU over 80 % for a minute"."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1) * 100
    except OSError:
        return 0.0


def gpu_memory_percent(heartbeats: list[dict]) -> float:
    """The fullest worker's KV cache (vLLM reports it; llama.cpp workers report nothing)."""
    usage = []
    for beat in heartbeats:
        try:
            usage.append(float((beat.get("engine_metrics") or {}).get("kv_cache_usage") or 0))
        except (AttributeError, TypeError, ValueError):
            continue  # a garbled figure from one worker says nothing about the others
    return max(usage, default=0.0) * 100


def degradation_compute(
    *, settings: DegradationSettings, backlog: int, cpu_percent: float, gpu_percent: float
) -> Degradation:
    signals = {
        "backlog": backlog / settings.backlog_threshold,
        "cpu": cpu_percent / settings.cpu_percent_threshold,
        "gpu_memory": gpu_percent / settings.gpu_memory_percent_threshold,
    }
    pressure = max(signals.values())
    level = (
        3
        if pressure >= settings.level3_ratio
        else 2
        if pressure >= settings.level2_ratio
        else 1
        if pressure >= 1
        else 0
    )
    forced = settings.forced_level is not None
    if forced:
        level = settings.forced_level
    return Degradation(
        level=level,
        cap_max_tokens=settings.capped_max_tokens
        if level >= settings.cap_max_tokens_level
        else None,
        skip_retrieval=level >= settings.skip_retrieval_level,
        reject_lowest_plan=level >= settings.reject_lowest_plan_level,
        retry_after=settings.reject_retry_after_seconds,
        signals={name: round(value, 3) for name, value in signals.items()},
        forced=forced,
    )


def degradation_publish(
    client: redis.Redis,
    keys: Keys,
    *,
    settings: DegradationSettings,
    backlog: int,
    heartbeats: list[dict],
    workers: int,
    slots: int,
    running: int,
    service_s: float,
) -> Degradation:
    """Computes the level from the backlog, this host's CPU and the workers' KV caches, and
    publishes it with the gauges /metrics shows."""
    degradation = degradation_compute(
        settings=settings,
        backlog=backlog,
        cpu_percent=host_cpu_percent(),
        gpu_percent=gpu_memory_percent(heartbeats),
    )
    pipe = client.pipeline(transaction=False)
    pipe.set(keys.degradation, degradation.to_json(), ex=PUBLISHED_TTL_SECONDS)
    pipe.hset(
        keys.metrics,
        mapping={
            "gauge:workers": workers,
            "gauge:slots": slots,
            "gauge:running": running,
            "gauge:service_seconds": service_s,
        },
    )
    pipe.expire(keys.metrics, METRICS_TTL_SECONDS)
    pipe.execute()
    return degradation
