"""The operations page's data: one refresh in two Redis round trips and at most two SQL queries.

Redis: (1) the workers' sorted set, the dispatcher's published state (line summary, workers it
has seen, heaviest users, rolling figures), the degradation level, the samples newer than the
page's last one, the dead-letter stream's newest entries and length, the queue's length; (2) the
heartbeats of every worker known to either. SQL: the plans (who is shed), and the heaviest
users' names with their plan overrides (only when there are some).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from apps.accounts.models import User
from apps.admission.degradation import Degradation
from apps.admission.models import Plan
from apps.admission.timeseries import SERIES_MAXLEN
from core.redis_client import get_redis, keys

DEAD_SHOWN = 20
LIVE_MS = 15_000  # as the dispatcher counts a worker live (release.LIVE_SECONDS)


@dataclass
class Worker:
    id: str
    beat: dict
    status: str  # live, unhealthy, draining, breaker-open, breaker-half-open, gone
    age_s: float  # since its last heartbeat

    @property
    def engine_metrics(self) -> dict:
        return self.beat.get("engine_metrics") or {}

    @property
    def kv_cache(self) -> float | None:
        return _float(self.engine_metrics.get("kv_cache_usage"))

    @property
    def prefix_hit_rate(self) -> float | None:
        return _float(self.engine_metrics.get("prefix_cache_hit_rate"))


@dataclass
class DeadLetter:
    entry_id: str
    fields: dict
    retryable: bool


@dataclass
class Snapshot:
    at_ms: int
    workers: list[Worker]
    state: dict | None  # what the dispatcher published; None: no dispatcher is publishing
    degradation: Degradation
    queue_depth: int
    samples: list[tuple[str, dict]]  # (stream id, sample) newer than the page's last
    dead: list[DeadLetter]
    dead_total: int
    plans: list[Plan] = field(default_factory=list)
    users: list[dict] = field(default_factory=list)

    @property
    def windows(self) -> dict:
        return (self.state or {}).get("windows") or {}

    @property
    def line(self) -> dict:
        return (self.state or {}).get("line") or {}

    @property
    def shed_plans(self) -> list[Plan]:
        """The plans whose new requests are rejected at this level: those of the lowest weight,
        when some plan weighs more (as the dispatcher's PlanBook.is_lowest decides)."""
        if not self.degradation.reject_lowest_plan or not self.plans:
            return []
        weights = [p.priority_weight for p in self.plans]
        lowest, highest = min(weights), max(weights)
        return [p for p in self.plans if p.priority_weight <= lowest < highest]

    @property
    def series(self) -> dict:
        """The new samples for the page's charts, and the id to ask for the next ones after."""
        return {
            "last": self.samples[-1][0] if self.samples else "",
            "samples": [s for _, s in self.samples],
        }


def gather(*, since: str = "") -> Snapshot:
    k = keys()
    client = get_redis()
    pipe = client.pipeline(transaction=False)
    pipe.zrange(k.workers, 0, -1, withscores=True)
    pipe.get(k.ops_state)
    pipe.get(k.degradation)
    pipe.xrange(k.series, min=f"({since}" if since else "-", count=SERIES_MAXLEN)
    pipe.xrevrange(k.dead, count=DEAD_SHOWN)
    pipe.xlen(k.dead)
    pipe.hlen(k.queue)
    zset, raw_state, raw_level, series, dead, dead_total, depth = pipe.execute()
    state = _json(raw_state)
    remembered = (state or {}).get("workers") or {}
    last_beat_at = {str(w): score for w, score in zset}
    ids = sorted(set(last_beat_at) | set(remembered))
    beats = client.mget([k.heartbeat(w) for w in ids]) if ids else []
    now = int(time.time() * 1000)
    workers = []
    for worker_id, raw in zip(ids, beats, strict=True):
        beat = _json(raw)
        fresh = isinstance(beat, dict)
        if not fresh:
            beat = (remembered.get(worker_id) or {}).get("beat") or {"worker_id": worker_id}
        at = _float(beat.get("at_ms")) or last_beat_at.get(worker_id, 0) * 1000
        age = max(0.0, (now - at) / 1000) if at else float("inf")
        if not fresh or age * 1000 > LIVE_MS:
            status = "gone"
        elif beat.get("draining"):
            status = "draining"
        elif not beat.get("healthy", True):
            status = "unhealthy"
        elif (beat.get("breaker") or {}).get("state", "closed") != "closed":
            status = f"breaker-{beat['breaker']['state'].replace('_', '-')}"  # out of routing
        else:
            status = "live"
        if status != "gone" or age < 15 * 60:
            workers.append(Worker(worker_id, beat, status, age))
    workers.sort(key=lambda w: (w.status == "gone", w.id))
    snapshot = Snapshot(
        at_ms=now,
        workers=workers,
        state=state,
        degradation=Degradation.from_json(raw_level),
        queue_depth=int(depth),
        samples=[(i, s) for i, s in _samples(series)],
        dead=[DeadLetter(i, f, retry_target(k, f) is not None) for i, f in dead],
        dead_total=int(dead_total),
        plans=list(Plan.objects.order_by("priority_weight", "name")),
    )
    snapshot.users = heaviest_users((state or {}).get("users") or [])
    return snapshot


def heaviest_users(rows: list[dict]) -> list[dict]:
    """The dispatcher's heaviest users with their names and plan overrides: one query."""
    ids = [int(r["user"]) for r in rows if str(r.get("user", "")).isdigit()]
    if not ids:
        return []
    found = {
        u["id"]: u
        for u in User.objects.filter(pk__in=ids).values(
            "id", "username", "plan_override__id", "plan_override__plan__name"
        )
    }
    users = []
    for row in rows:
        known = found.get(int(row["user"])) if str(row.get("user", "")).isdigit() else None
        users.append(
            {
                **row,
                "username": known["username"] if known else f"#{row['user']}",
                "override_id": known and known["plan_override__id"],
                "override_plan": known and known["plan_override__plan__name"],
                "user_id": known and known["id"],
            }
        )
    return users


def retry_target(k, fields: dict) -> str | None:
    """The stream a dead letter goes back to on retry: admission entries to the admission
    stream, work items to their work stream (a worker's affinity stream's to the shared one,
    as that worker may be gone); None for what cannot be retried (answer records, queue
    records)."""
    stream = fields.get("stream") or ""
    if stream == k.admit:
        return stream
    if stream == k.work or k.is_model_work(stream):
        return stream
    if stream.startswith(k.work + ":"):
        return k.work
    return None


def _samples(entries) -> list[tuple[str, dict]]:
    found = []
    for entry_id, fields in entries:
        sample = _json(fields.get("s"))
        if isinstance(sample, dict):
            found.append((entry_id, sample))
    return found


def _json(raw):
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _float(value) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None
