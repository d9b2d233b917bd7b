"""A worker's Prometheus metrics, served on its own port (`--metrics-port`, off by default:
several workers on one machine would want the same one), and its per-request log lines.

Counters and histograms are updated as answers end; the gauges (slots, busy, the engine's own
figures such as KV-cache use and prefix-cache hit rate) are read from the worker's last
heartbeat when Prometheus scrapes, so the request path pays nothing for them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from contract.logs import request_id_var
from contract.protocol import Answer, State

log = logging.getLogger("sluice.worker")

REGISTRY = CollectorRegistry(auto_describe=True)
ANSWERS = Counter(
    "sluice_worker_answers",
    "Answers this worker ended, by end state.",
    ["state"],
    registry=REGISTRY,
)
TOKENS = Counter(
    "sluice_worker_tokens",
    "Tokens this worker processed (prompt, completion).",
    ["kind"],
    registry=REGISTRY,
)
ATTEMPTS = Counter(
    "sluice_worker_attempts_started", "Attempts started (a rerun counts again).", registry=REGISTRY
)
TTFT = Histogram(
    "sluice_worker_ttft_seconds",
    "From the attempt's start to its first token (the engine's).",
    buckets=(0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30),
    registry=REGISTRY,
)
PER_TOKEN = Histogram(
    "sluice_worker_time_per_token_seconds",
    "Mean time between tokens after the first, per answer.",
    buckets=(0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1),
    registry=REGISTRY,
)
DURATION = Histogram(
    "sluice_worker_answer_seconds",
    "Generation time of an answer on this worker.",
    buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600),
    registry=REGISTRY,
)
# Engine figures exported when a heartbeat reports them (vLLM reports all, llama.cpp some).
ENGINE_GAUGES = {
    "kv_cache_usage": "Share of the KV cache in use (0-1).",
    "prefix_cache_hit_rate": "Prefix-cache hit rate over the engine's recent requests (0-1).",
    "running": "Sequences the engine is running.",
    "waiting": "Sequences waiting inside the engine.",
    "preemptions": "Sequences the engine preempted (cumulative).",
}


class BeatCollector(Collector):
    """Gauges from the worker's last heartbeat payload, read at scrape time."""

    def __init__(self, last_beat: Callable[[], dict | None]) -> None:
        self.last_beat = last_beat

    def collect(self):
        beat = self.last_beat() or {}
        if not beat:
            return
        labels = {
            "worker": str(beat.get("worker_id", "")),
            "engine": str(beat.get("engine", "")),
            "model": str(beat.get("model", "")),
        }
        names, values = list(labels), list(labels.values())
        own = [
            ("capacity_slots", "Concurrent answers this worker offers.", beat.get("slots")),
            ("busy_slots", "Answers running now.", beat.get("busy")),
            ("healthy", "1 while the engine reports healthy.", bool(beat.get("healthy"))),
            ("draining", "1 while the worker is stopping.", bool(beat.get("draining"))),
            (
                "breaker_open",
                "1 while its circuit breaker keeps it out of routing (open or half-open).",
                (beat.get("breaker") or {}).get("state", "closed") != "closed",
            ),
            (
                "tokens_per_second",
                "Tokens per second over the last ~10 s.",
                beat.get("tokens_per_second"),
            ),
        ]
        engine = beat.get("engine_metrics") or {}
        own += [(f"engine_{k}", h, engine.get(k)) for k, h in ENGINE_GAUGES.items() if k in engine]
        for name, help_text, value in own:
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            family = GaugeMetricFamily(f"sluice_worker_{name}", help_text, labels=names)
            family.add_metric(values, number)
            yield family


def serve(port: int, last_beat: Callable[[], dict | None], *, addr: str = "0.0.0.0") -> None:
    """Serves /metrics on `port` from a thread of its own."""
    REGISTRY.register(BeatCollector(last_beat))
    start_http_server(port, addr=addr, registry=REGISTRY)
    log.info("metrics on http://%s:%d/metrics", addr, port)


# -- hooks the attempt calls --------------------------------------------------------------------


def started(request_id: str, *, attempt: int, worker_id: str) -> None:
    """An attempt began: later log lines of this task carry the request id."""
    request_id_var.set(request_id)
    ATTEMPTS.inc()
    log.info("request %s started: attempt %d on %s", request_id, attempt, worker_id)


def first_token(request_id: str, ttft_ms: float) -> None:
    log.info("request %s first token after %.0f ms", request_id, ttft_ms)


def ended(answer: Answer) -> None:
    usage = answer.usage
    ANSWERS.labels(str(answer.state)).inc()
    TOKENS.labels("prompt").inc(max(0, int(usage.prompt_tokens or 0)))
    TOKENS.labels("completion").inc(max(0, int(usage.completion_tokens or 0)))
    if answer.state == State.DONE and usage.ttft_ms is not None:
        TTFT.observe(usage.ttft_ms / 1000)
        if usage.duration_ms and usage.completion_tokens and usage.completion_tokens > 1:
            decode_ms = max(0.0, usage.duration_ms - usage.ttft_ms)
            PER_TOKEN.observe(decode_ms / 1000 / (usage.completion_tokens - 1))
    if usage.duration_ms:
        DURATION.observe(usage.duration_ms / 1000)
    log.info(
        "request %s finished: %s, attempt %d, %d tokens in %s ms%s",
        answer.id,
        answer.state,
        answer.attempt,
        usage.completion_tokens or 0,
        _ms(usage.duration_ms),
        f": {answer.error}" if answer.error else "",
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
