"""Degradation levels: how much the service sheds when it is overloaded.

The dispatcher computes the level from four signals, each as a ratio of its threshold, and
publishes it in Redis with its effects and each signal's source, every few seconds, with the
fleet's gauges. Web processes read it (see selectors.degradation_get):

  backlog     people's requests charged and waiting for a worker (not background work, not
              requests their own plan's rate holds back)
  wait        the longest a person's request waited for a worker: those released since the
              last computation and the one at the head of the line now
  cpu         the busiest Sluice service process: the dispatcher's own CPU time and each web
              process's (published by itself, see `WebCpuPublisher`), as a share of one core
              over the last 30 s.
              Not the machine's load: on one box the inference workers' decoding is the work
              the service exists to do, and its pressure shows as backlog and wait instead.
  gpu_memory  the fullest worker's KV cache / GPU memory, as workers report it

  level 0  normal
  level 1  answers capped at `capped_max_tokens`          (cap_max_tokens_level, default 1);
           background work waits in line until the level is back at 0
  level 2  also: expensive retrieval steps are skipped     (skip_retrieval_level, default 2)
  level 3  also: new requests of the lowest plan rejected  (reject_lowest_plan_level, default 3)
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields

import redis

from apps.admission.models import DegradationSettings
from contract.protocol import METRICS_TTL_SECONDS, Keys

log = logging.getLogger("sluice.degradation")

PUBLISHED_TTL_SECONDS = 30  # a dispatcher that stops publishing stops degrading the service
CPU_PUBLISH_SECONDS = 2.0  # how often a web process publishes its own CPU share
CPU_STALE_SECONDS = 15  # a share older than this is from a process that stopped
CPU_WINDOW_SECONDS = 30.0  # a process busy this long is under pressure; a burst is not


@dataclass
class Degradation:
    level: int = 0
    cap_max_tokens: int | None = None
    skip_retrieval: bool = False
    reject_lowest_plan: bool = False
    retry_after: int = 60
    signals: dict[str, float] = field(default_factory=dict)
    forced: bool = False
    # Each signal's source and figure in words, for the operations page.
    sources: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str | None) -> Degradation:
        if not raw:
            return cls()
        try:
            known = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in json.loads(raw).items() if k in known})
        except (AttributeError, TypeError, ValueError):
            return cls()


class ProcessCpu:
    """This process's own CPU share (100 = one core busy) over the last `window` seconds: CPU
    time of all its threads over wall time. A Python process serves on one core at a time, so
    a share near 100 means its requests wait for it, whatever else the machine runs. Divided by
    the whole window even when less has passed, so a start-up's burst (loading models) is not
    read as load: the share is high only when the process has been busy that long."""

    def __init__(self, *, window: float = CPU_WINDOW_SECONDS) -> None:
        self.window = window
        self._readings: deque[tuple[float, float]] = deque([(time.monotonic(), _cpu())])

    def share(self) -> float:
        wall, cpu = time.monotonic(), _cpu()
        readings = self._readings
        while len(readings) > 1 and readings[1][0] <= wall - self.window:
            readings.popleft()  # the oldest kept reading starts the window
        first_wall, first_cpu = readings[0]
        readings.append((wall, cpu))
        return max(0.0, (cpu - first_cpu) / max(wall - first_wall, self.window) * 100)


def _cpu() -> float:
    return time.process_time()


def process_name(role: str) -> str:
    return f"{role}:{socket.gethostname()}:{os.getpid()}"


def cpu_share_publish(
    client: redis.Redis, keys: Keys, *, name: str, percent: float, now_ms: int
) -> None:
    pipe = client.pipeline(transaction=False)
    pipe.hset(keys.process_cpu(), name, f"{percent:.1f} {now_ms}")
    pipe.expire(keys.process_cpu(), PUBLISHED_TTL_SECONDS)
    pipe.execute()


def cpu_shares_read(client: redis.Redis, keys: Keys, *, now_ms: int) -> dict[str, float]:
    """The web processes' published shares; stale or unreadable ones are removed."""
    shares, stale = {}, []
    for name, value in client.hgetall(keys.process_cpu()).items():
        try:
            percent, at_ms = value.split()
            if now_ms - int(at_ms) > CPU_STALE_SECONDS * 1000:
                raise ValueError("stale")
            shares[name] = float(percent)
        except ValueError:
            stale.append(name)
    if stale:
        client.hdel(keys.process_cpu(), *stale)
    return shares


class WebCpuPublisher:
    """A web process's thread that publishes its own CPU share every few seconds (started by
    the admission app when the process is a web server)."""

    def __init__(
        self,
        *,
        client_for: Callable[[], redis.Redis],
        keys_for: Callable[[], Keys],
        interval: float = CPU_PUBLISH_SECONDS,
    ) -> None:
        self.client_for, self.keys_for, self.interval = client_for, keys_for, interval
        self.name = process_name("web")
        self.cpu = ProcessCpu()
        self.stopped = threading.Event()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="sluice-cpu-share", daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                cpu_share_publish(
                    self.client_for(),
                    self.keys_for(),
                    name=self.name,
                    percent=self.cpu.share(),
                    now_ms=int(time.time() * 1000),
                )
            except redis.RedisError as exc:  # the next beat tries again
                log.debug("CPU share not published: %s", exc)


def gpu_memory_percent(heartbeats: list[dict]) -> tuple[float, str, int]:
    """The fullest worker's KV cache (vLLM reports it; llama.cpp workers report nothing), which
    worker that is, and how many workers report a figure."""
    usage: list[tuple[float, str]] = []
    for beat in heartbeats:
        try:
            reported = (beat.get("engine_metrics") or {}).get("kv_cache_usage")
            figure = float(reported or 0)
        except (AttributeError, TypeError, ValueError):
            continue  # a garbled figure from one worker says nothing about the others
        if reported is not None:
            usage.append((figure * 100, str(beat.get("worker_id", "?"))))
    return (*max(usage, default=(0.0, "")), len(usage))


@dataclass
class Pressure:
    """The figures the level is computed from, with where each came from."""

    backlog: int = 0
    wait_s: float = 0.0
    cpu_percent: float = 0.0
    cpu_process: str = ""  # the busiest Sluice process
    gpu_percent: float = 0.0
    gpu_worker: str = ""  # the worker with the fullest KV cache ("": none reports one)
    reporting: int = 0  # workers whose heartbeat carries a KV-cache figure

    def sources(self) -> dict[str, str]:
        gpu = (
            f"fullest KV cache of {self.reporting} reporting worker(s): "
            f"{self.gpu_percent:.0f} % on {self.gpu_worker}"
            if self.reporting
            else "no worker reports GPU memory (llama.cpp workers do not)"
        )
        return {
            "backlog": f"people's requests waiting for a worker: {self.backlog}",
            "wait": f"longest wait of a person's request for a worker: {self.wait_s:.1f} s",
            "cpu": f"busiest Sluice process, its own CPU: {self.cpu_process or 'none'} at "
            f"{self.cpu_percent:.0f} % of a core (inference workers not counted)",
            "gpu_memory": gpu,
        }


def degradation_compute(*, settings: DegradationSettings, pressure: Pressure) -> Degradation:
    signals = {
        "backlog": pressure.backlog / settings.backlog_threshold,
        "wait": pressure.wait_s / settings.queue_wait_seconds_threshold,
        "cpu": pressure.cpu_percent / settings.cpu_percent_threshold,
        "gpu_memory": pressure.gpu_percent / settings.gpu_memory_percent_threshold,
    }
    highest = max(signals.values())
    level = (
        3
        if highest >= settings.level3_ratio
        else 2
        if highest >= settings.level2_ratio
        else 1
        if highest >= 1
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
        sources=pressure.sources(),
    )


def pressure_measure(
    client: redis.Redis,
    keys: Keys,
    *,
    backlog: int,
    wait_s: float,
    own_cpu: float,
    heartbeats: list[dict],
    now_ms: int,
) -> Pressure:
    """The dispatcher's figures with the web processes' CPU shares and the workers' reports."""
    shares = cpu_shares_read(client, keys, now_ms=now_ms)
    shares[process_name("dispatcher")] = own_cpu
    busiest = max(shares, key=shares.__getitem__)
    gpu, worker, reporting = gpu_memory_percent(heartbeats)
    return Pressure(
        backlog=backlog,
        wait_s=wait_s,
        cpu_percent=shares[busiest],
        cpu_process=busiest,
        gpu_percent=gpu,
        gpu_worker=worker,
        reporting=reporting,
    )


def degradation_publish(
    client: redis.Redis,
    keys: Keys,
    *,
    settings: DegradationSettings,
    pressure: Pressure,
    workers: int,
    slots: int,
    running: int,
    service_s: float,
) -> Degradation:
    """Computes the level and publishes it with the gauges /metrics shows."""
    degradation = degradation_compute(settings=settings, pressure=pressure)
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
