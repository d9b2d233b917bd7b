"""What the operations page shows over time, recorded by the dispatcher out of the request path.

The dispatcher already sees every answer (the recorder hands each one to `settle`) and every
admission decision (its metrics batches). It folds them into one small sample every
`SAMPLE_SECONDS` (answers, tokens, latency histograms, rejections by reason, the line's depth)
appended to a capped stream, and every `STATE_SECONDS` it publishes one JSON document: the
line's summary and head, the workers it has seen (a vanished worker stays listed as gone), the
heaviest users of the last hour and the rolling figures over 5 and 60 minutes. A refresh of the
page then reads a few keys instead of the line itself. Hooks let the dispatcher's Prometheus
endpoint observe the same answers.

Latencies are what a user sees: time to first token is the wait in line plus the engine's own
time to first token; end to end runs from the web's submission to the answer being settled.
"""

from __future__ import annotations

import json
import logging
import time
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

import redis

from apps.admission import metrics
from apps.admission.heaviest import HeaviestUsers
from contract.protocol import Answer, Keys, State

log = logging.getLogger("sluice.dispatcher")

SAMPLE_SECONDS = 5.0
STATE_SECONDS = 2.0
WINDOWS_MINUTES = (5, 60)
SERIES_MAXLEN = 60 * 60 // int(SAMPLE_SECONDS) + 60  # an hour of samples, and a margin
SERIES_TTL_SECONDS = 2 * 3600  # kept while a dispatcher writes, like every admission key
STATE_TTL_SECONDS = 30  # a dispatcher that stops publishing leaves no stale picture
GONE_KEEP_MS = 15 * 60 * 1000  # a worker that vanished is shown as gone this long
HEAD = 10  # requests of the line's head shown in release order
# Upper bounds (ms) of the latency histograms; a last bucket holds anything longer.
BOUNDS_MS = (
    50,
    100,
    200,
    300,
    500,
    750,
    1000,
    1500,
    2000,
    3000,
    5000,
    7500,
    10_000,
    15_000,
    30_000,
    60_000,
    120_000,
)


def bucket_of(ms: float) -> int:
    return bisect_left(BOUNDS_MS, ms)


def percentile(hist: dict, p: float) -> float | None:
    """The upper bound of the bucket holding the p-th percentile (`hist`: bucket → count, keys
    int or str as JSON leaves them); None without data. The last bucket reads as twice the
    last bound."""
    counts = sorted((int(k), v) for k, v in hist.items() if v)
    total = sum(v for _, v in counts)
    if not total:
        return None
    rank, seen = p / 100 * total, 0
    for index, count in counts:
        seen += count
        if seen >= rank:
            return float(BOUNDS_MS[index] if index < len(BOUNDS_MS) else BOUNDS_MS[-1] * 2)
    return float(BOUNDS_MS[-1] * 2)


def merged(hists) -> dict[int, int]:
    total: Counter[int] = Counter()
    for hist in hists:
        for k, v in hist.items():
            total[int(k)] += v
    return dict(total)


@dataclass
class AnswerFigures:
    """One answer as the figures use it; None where it does not apply."""

    answer: Answer
    ran: bool  # a worker ran it (attempt > 0), as opposed to ending in line
    ttft_ms: float | None
    e2e_ms: float | None
    wait_ms: float | None  # from submission to dispatch
    prompt_estimate_ratio: float | None  # real prompt tokens / the web's estimate


def settled(
    answer: Answer, *, created_ms: int | None, dispatched_ms: int | None, now_ms: int
) -> AnswerFigures:
    ran = answer.attempt > 0
    wait = dispatched_ms - created_ms if created_ms and dispatched_ms else None
    ttft = e2e = ratio = None
    usage = answer.usage
    if ran and answer.state == State.DONE:
        if usage.ttft_ms is not None:
            ttft = max(0.0, (wait or 0) + float(usage.ttft_ms))
        if created_ms:
            e2e = max(0.0, float(now_ms - created_ms))
        if answer.prompt_tokens_estimate and usage.prompt_tokens:
            ratio = usage.prompt_tokens / answer.prompt_tokens_estimate
    return AnswerFigures(answer, ran, ttft, e2e, None if wait is None else max(0, wait), ratio)


class Samples:
    """The dispatcher's recorder of samples and of the ops page's state."""

    def __init__(self, client: redis.Redis, keys: Keys, *, now_ms: Callable[[], int]) -> None:
        self.client = client
        self.keys = keys
        self.now_ms = now_ms
        self.hooks: list[Callable[[AnswerFigures], None]] = []
        self.series: deque[dict] = deque(maxlen=SERIES_MAXLEN)
        self.workers: dict[str, dict] = {}  # id → {"beat": last heartbeat, "seen_ms": ...}
        self.users = HeaviestUsers(client, keys, now_ms=now_ms)  # counted by `settle_users`
        self._loaded = False
        self._due = {"sample": 0.0, "state": 0.0}
        self._reset()

    def _reset(self) -> None:
        self._started = time.monotonic()
        self._totals = Counter(metrics.TOTALS)  # decisions counted since: the difference
        self._counts: Counter[str] = Counter()
        self._ttft: Counter[int] = Counter()
        self._e2e: Counter[int] = Counter()

    # -- feeding ---------------------------------------------------------------------------------

    def settle(
        self, answer: Answer, *, created_ms: int | None, dispatched_ms: int | None, plan: str = ""
    ) -> None:
        record = settled(
            answer, created_ms=created_ms, dispatched_ms=dispatched_ms, now_ms=self.now_ms()
        )
        c = self._counts
        if record.ran:
            c["run"] += 1
            c[str(answer.state)] += 1
            c["tokens"] += int(answer.usage.completion_tokens or 0)
        if record.ttft_ms is not None:
            self._ttft[bucket_of(record.ttft_ms)] += 1
        if record.e2e_ms is not None:
            self._e2e[bucket_of(record.e2e_ms)] += 1
        if answer.state == State.FAILED or not record.ran:
            log.info(
                "request %s settled: %s after %s attempt(s)%s",
                answer.id,
                answer.state,
                answer.attempt,
                f": {answer.error}" if answer.error else "",
            )
        else:
            log.info(
                "request %s settled: %s, %s tokens, ttft %s ms, end to end %s ms",
                answer.id,
                answer.state,
                answer.usage.completion_tokens,
                _ms(record.ttft_ms),
                _ms(record.e2e_ms),
            )
        for hook in self.hooks:
            hook(record)

    def settle_users(self, pipe, answers: list[Answer]) -> None:
        """The heaviest users' counts, queued on the pipeline that settles the answers."""
        self.users.count(pipe, answers)

    # -- publishing ------------------------------------------------------------------------------

    def tick(self, *, line, fleet_view, running: int, degradation, holder: str) -> None:
        """Called every dispatcher pass; writes only when a sample or the state is due."""
        now = time.monotonic()
        if not self._loaded:
            self._load()
        if now >= self._due["sample"]:
            self._due["sample"] = now + SAMPLE_SECONDS
            self._sample(
                line=line, fleet=fleet_view.fleet, running=running, level=degradation.level
            )
        if now >= self._due["state"]:
            self._due["state"] = now + STATE_SECONDS
            self._publish(line=line, running=running, holder=holder)

    def _load(self) -> None:
        """A new lease holder goes on from the samples its predecessor wrote."""
        self._loaded = True
        for _, fields in self.client.xrevrange(self.keys.series, count=SERIES_MAXLEN)[::-1]:
            try:
                self.series.append(json.loads(fields["s"]))
            except (KeyError, ValueError, TypeError):
                continue

    def _sample(self, *, line, fleet, running: int, level: int) -> None:
        c = self._counts
        sample = {
            "t": self.now_ms(),
            "dt": round(max(0.001, time.monotonic() - self._started), 3),
            "run": c["run"],
            "done": c["done"],
            "failed": c["failed"],
            "cancelled": c["cancelled"],
            "tokens": c["tokens"],
            "ttft": dict(self._ttft),
            "e2e": dict(self._e2e),
            "ttft50": percentile(self._ttft, 50),
            "ttft99": percentile(self._ttft, 99),
            "e2e99": percentile(self._e2e, 99),
            "ended": self._ended(),  # rejected:rate, timed_out:no_worker, ...
            "queue": len(line),
            "running": running,
            "slots": fleet.slots,
            "workers": len(fleet.workers),
            "level": level,
        }
        self._reset()
        self.series.append(sample)
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(
            self.keys.series,
            {"s": json.dumps(sample, separators=(",", ":"))},
            maxlen=SERIES_MAXLEN,
            approximate=True,
        )
        pipe.expire(self.keys.series, SERIES_TTL_SECONDS)
        pipe.execute()

    def _ended(self) -> dict[str, int]:
        """Requests ended in line since the last sample, by status and reason."""
        ended = {}
        for name, total in metrics.TOTALS.items():
            status, _, reason = name.removeprefix("requests:").partition(":")
            if name.startswith("requests:") and reason and status in ("rejected", "timed_out"):
                if total - self._totals.get(name, 0):
                    ended[f"{status}:{reason}"] = total - self._totals.get(name, 0)
        return ended

    def _publish(self, *, line, running: int, holder: str) -> None:
        now = self.now_ms()
        ids = self.client.zrange(self.keys.workers, 0, -1)
        beats = self.client.mget([self.keys.heartbeat(w) for w in ids]) if ids else []
        for raw in beats:
            try:
                beat = json.loads(raw) if raw else None
            except ValueError:
                beat = None
            if isinstance(beat, dict) and beat.get("worker_id"):
                self.workers[str(beat["worker_id"])] = {"beat": beat, "seen_ms": now}
        for worker_id in [w for w, v in self.workers.items() if now - v["seen_ms"] > GONE_KEEP_MS]:
            del self.workers[worker_id]
        state = {
            "at_ms": now,
            "holder": holder,
            "running": running,
            "line": line_summary(line, now_ms=now),
            "workers": self.workers,
            "users": self.heaviest(),
            "windows": {str(m): self.window(m) for m in WINDOWS_MINUTES},
        }
        self.client.set(
            self.keys.ops_state, json.dumps(state, separators=(",", ":")), ex=STATE_TTL_SECONDS
        )

    def window(self, minutes: int) -> dict:
        """The rolling figures over the last `minutes`."""
        since = self.now_ms() - minutes * 60_000
        samples = [s for s in self.series if s["t"] > since]
        seconds = sum(s["dt"] for s in samples) or 1.0
        run = sum(s["run"] for s in samples)
        ended: Counter[str] = Counter()
        for s in samples:
            ended.update(s.get("ended") or {})
        ttft, e2e = merged(s["ttft"] for s in samples), merged(s["e2e"] for s in samples)
        return {
            "seconds": round(seconds, 1),
            "answers": run,
            "answers_per_s": round(run / seconds, 3),
            "tokens_per_s": round(sum(s["tokens"] for s in samples) / seconds, 1),
            "ttft50": percentile(ttft, 50),
            "ttft99": percentile(ttft, 99),
            "e2e99": percentile(e2e, 99),
            "error_rate": round(sum(s["failed"] for s in samples) / run, 4) if run else 0.0,
            "ended": dict(ended),
            "rejected_per_min": round(
                sum(v for k, v in ended.items() if k.startswith("rejected:")) / seconds * 60, 2
            ),
        }

    def heaviest(self) -> list[dict]:
        return self.users.top()


def line_summary(line, *, now_ms: int) -> dict:
    """Waiting per plan (charged, or held by the plan's rate), the oldest wait, and the head of
    the line in release order. One walk of the line, every few seconds."""
    plans: dict[str, dict[str, int]] = {}
    oldest = None
    for request in line.requests.values():
        counts = plans.setdefault(request.plan, {"waiting": 0, "held": 0})
        counts["waiting"] += 1
        if not request.charged:
            counts["held"] += 1
        if oldest is None or request.submitted_ms < oldest:
            oldest = request.submitted_ms
    head = []
    for request_id in line.head(HEAD):
        r = line.requests.get(request_id)
        if r is not None:
            head.append(
                {
                    "id": r.id,
                    "user": r.user_id,
                    "plan": r.plan,
                    "cost": r.cost,
                    "charged": r.charged,
                    "held_by": r.held_by,
                    "waited_ms": max(0, now_ms - r.submitted_ms),
                }
            )
    return {
        "waiting": len(line),
        "plans": plans,
        "head": head,
        "oldest_wait_ms": None if oldest is None else max(0, now_ms - oldest),
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
