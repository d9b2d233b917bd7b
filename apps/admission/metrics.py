"""Admission counters kept in one Redis hash, so any web process can serve /metrics for the
dispatcher (apps/ops/metrics.py renders them in the Prometheus text format)."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field

from contract.protocol import METRICS_TTL_SECONDS

# Upper bounds (ms) of the admission-latency histogram: from the web's XADD to the decision.
LATENCY_BUCKETS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
# `requests:<status>`: admitted (charged), queued (told a first position), rejected and
# timed_out (with a reason below), cancelled (stopped in line), withdrawn (given up by the web
# before Redis took it), lost (its worker stopped before it finished), invalid (an admission
# entry that could not be read, dead-lettered), background_dropped (background work whose own
# wait ran out in line: dropped quietly, nobody was waiting for it).
STATUSES = (
    "admitted",
    "queued",
    "rejected",
    "timed_out",
    "cancelled",
    "withdrawn",
    "lost",
    "invalid",
    "background_dropped",
)
# `requests:<status>:<reason>`, counted besides the status's total. rate: the plan's rate or
# daily quota; too_large: more tokens than the plan allows at once; shed: the lowest plan under
# heavy load; no_worker: charged, but no worker slot came free in time.
REASONS = {
    "rejected": ("rate", "too_large", "shed"),
    "timed_out": ("rate", "no_worker"),
}

# Every count this process has written (`requests:rejected:rate`, `tokens:<plan>`, ...): the
# dispatcher's own figures (its Prometheus endpoint, the ops page's samples) read the same
# decisions here instead of reading the hash back.
TOTALS: Counter[str] = Counter()


@dataclass
class MetricsBatch:
    """Increments gathered during one pass and written with one HINCRBY each."""

    counts: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    _latency: Counter = field(default_factory=Counter)
    _latency_sum: float = 0.0

    def count(self, status: str, n: int = 1, *, reason: str = "") -> None:
        self.counts[status] = self.counts.get(status, 0) + n
        if reason:
            name = f"{status}:{reason}"
            self.counts[name] = self.counts.get(name, 0) + n

    def latency(self, ms: float) -> None:
        ms = max(0.0, ms)
        index = bisect_left(LATENCY_BUCKETS_MS, ms)  # the first bound >= ms
        bound = LATENCY_BUCKETS_MS[index] if index < len(LATENCY_BUCKETS_MS) else "inf"
        self._latency[bound] += 1
        self._latency_sum += ms

    def write(self, pipe, key: str) -> None:
        wrote = False
        for status, n in self.counts.items():
            if n:
                pipe.hincrby(key, f"requests:{status}", n)
                wrote = True
        for plan, n in self.tokens.items():
            if n:
                pipe.hincrby(key, f"tokens:{plan}", n)
                wrote = True
        for bound, n in self._latency.items():
            pipe.hincrby(key, f"latency:{bound}", n)
            wrote = True
        if self._latency:
            pipe.hincrbyfloat(key, "latency_sum_ms", self._latency_sum)
            pipe.hincrby(key, "latency_count", sum(self._latency.values()))
        if wrote:
            pipe.expire(key, METRICS_TTL_SECONDS)
        TOTALS.update({f"requests:{k}": n for k, n in self.counts.items() if n})
        TOTALS.update({f"tokens:{k}": n for k, n in self.tokens.items() if n})
