"""The dispatcher loop: admission decisions, the fair queue, release to workers, positions.

Only the holder of a lease in Redis acts; a standby polls for the lease and takes over when the
holder stops renewing it. Redis holds the authoritative queue (the `queue` hash, written in the
same MULTI that acknowledges the admission entry or hands the request to a worker); the fair
queue in memory is a mirror, rebuilt from Redis on takeover and after any Redis error.

A pass costs about the same with 50 or 50,000 requests waiting: deadlines sit in a heap, cancel
flags are read for a bounded slice of the queue (watch.py), and the whole line's order, which
positions need, is recomputed only as often as a small share of the dispatcher's time allows
(positions.py); the head of the line hears every change.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from redis.exceptions import ResponseError

from worker import protocol
from worker.protocol import Completion, Keys, State

from . import outcomes
from .buckets import NEVER, TAKEN, BucketStore, plan_buckets
from .degradation import (
    STATE_TTL_SECONDS,
    Degradation,
    degradation_compute,
    gpu_memory_percent,
    host_cpu_percent,
)
from .fairqueue import Entry, FairQueue
from .keys import ACTIVE_CONSUMER, DISPATCHER_GROUP, AdmissionKeys
from .keys import STATE_TTL_SECONDS as QUEUE_TTL
from .metrics import MetricsBatch
from .plans import PlanBook
from .positions import HEAD, positions_to_tell
from .watch import CancelWatch, DeadlineHeap

log = logging.getLogger("sluice.dispatcher")

RENEW_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
INFLIGHT_MAX_AGE_MS = 3600_000  # a dispatched request never reported done is forgotten after this
AFFINITY_MAX = 100_000


@dataclass
class Fleet:
    """Live workers as their heartbeats describe them, and the work streams' lengths."""

    slots: int = 0
    queued_on_streams: int = 0
    workers: dict[str, dict] = field(default_factory=dict)
    stream_len: dict[str, int] = field(default_factory=dict)
    heartbeats: list[dict] = field(default_factory=list)


@dataclass
class Options:
    lease_ms: int = 5000
    batch: int = 500  # admission entries read (and decided in one script call) at once
    prefetch: int = 0  # work entries allowed beyond the free slots (0: strictly as slots free)
    quantum: int = 256  # DRR tokens per turn per unit of plan weight
    block_ms: int = 50  # how long an idle loop waits for new admissions
    position_interval: float = 1.0
    position_pushes: int = 1000  # position events per pass (the head's changes come first)
    # Share of the dispatcher's time that recomputing the whole line's order may take: with a
    # long queue, positions beyond the head are refreshed less often than every interval.
    position_share: float = 0.05
    sweep_interval: float = 1.0  # cancel flags and queue-wait deadlines
    cancel_checks: int = 5000  # cancel flags read per sweep, beyond the stops noted in a set
    degradation_interval: float = 2.0
    fleet_interval: float = 0.5  # heartbeats reread at most this often (workers beat every 2 s)


class Dispatcher:
    def __init__(
        self,
        *,
        client: redis.Redis,
        keys: Keys,
        options: Options | None = None,
        holder: str | None = None,
        clock: Callable[[], float] = time.time,
        bucket_clock: Callable[[], int] | None = None,
        on_completion_pass: Callable[[Dispatcher], int] | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.akeys = AdmissionKeys(keys.prefix)
        self.options = options or Options()
        self.holder = holder or uuid.uuid4().hex
        self.clock = clock
        self.bucket_clock = bucket_clock  # None: the bucket script reads Redis TIME
        self.completion_pass = on_completion_pass
        self.buckets = BucketStore(client)
        self.renew = client.register_script(RENEW_LEASE)
        self.plans = PlanBook()
        self.active = False
        self.loaded = False
        self.loads = 0  # how many times the mirror was rebuilt from Redis
        self.degradation = Degradation()
        self.fleet = Fleet()
        self.affinity: OrderedDict[str, str] = OrderedDict()
        self.avg_service_s = 10.0
        self._reset_memory()
        self._due: dict[str, float] = {}

    def _reset_memory(self) -> None:
        self.fq = FairQueue(quantum=self.options.quantum)
        self.records: dict[str, dict] = {}
        self.deferred: dict[str, deque[str]] = {}
        self.deadlines = DeadlineHeap()
        self.cancel_watch = CancelWatch()
        self.inflight: dict[str, str] = {}
        self.inflight_by_user: Counter[str] = Counter()

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _every(self, name: str, interval: float) -> bool:
        now = time.monotonic()
        if now >= self._due.get(name, 0):
            self._due[name] = now + interval
            return True
        return False

    # -- the loop ------------------------------------------------------------------------------

    def step(self) -> int:
        """One pass; returns how many admission entries it decided. Raises Redis errors (the
        caller waits and retries; the mirror is rebuilt from Redis afterwards)."""
        try:
            if not self.hold_lease():
                return 0
            if not self.loaded:
                self.load()
            self.plans.refresh()
            # With requests waiting, wake often to notice freed slots; idle, wait for arrivals.
            waiting = bool(self.records)
            decided = self.intake(block_ms=min(20, self.options.block_ms) if waiting
                                  else self.options.block_ms)  # fmt: skip
            self.retry_deferred()
            if self._every("sweep", self.options.sweep_interval):
                self.sweep()
            self.release()
            # After the release: a request just admitted goes out before this pass stores the
            # answers that finished meanwhile (the next pass sees the slots they freed).
            if self.completion_pass:
                self.completion_pass(self)
            if self._every("positions", self.options.position_interval):
                self.tell_positions()
            if self._every("degradation", self.options.degradation_interval):
                self.publish_degradation()
            return decided
        except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.BusyLoadingError):
            self.loaded = False
            raise

    def hold_lease(self) -> bool:
        if self.active:
            if self._every("lease", self.options.lease_ms / 4000):
                if not self.renew(keys=[self.akeys.lease],
                                  args=[self.holder, self.options.lease_ms]):  # fmt: skip
                    log.warning("lost the dispatcher lease; standing by")
                    self.active = self.loaded = False
            return self.active
        if self.client.set(self.akeys.lease, self.holder, nx=True, px=self.options.lease_ms):
            log.info("holding the dispatcher lease: admitting and dispatching")
            self.active, self.loaded = True, False
            self._due["lease"] = time.monotonic() + self.options.lease_ms / 4000
            return True
        return False

    def release_lease(self) -> None:
        """On a clean stop: the standby need not wait for the lease to expire."""
        if self.active and self.client.get(self.akeys.lease) == self.holder:
            self.client.delete(self.akeys.lease)
        self.active = False

    def load(self) -> None:
        """Rebuilds the in-memory mirror from Redis: what a new lease holder starts from."""
        groups = ((self.keys.admit, DISPATCHER_GROUP), (self.keys.done, protocol.RECORDER_GROUP))
        for stream, group in groups:
            try:
                self.client.xgroup_create(stream, group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._reset_memory()
        records = [json.loads(raw) for raw in self.client.hgetall(self.akeys.queue).values()]
        for record in sorted(records, key=lambda r: r["seq"]):
            self._queue_in_memory(record)
        now = self.now_ms()
        stale = []
        for request_id, value in self.client.hgetall(self.akeys.inflight).items():
            user, _, since = value.partition("|")
            if now - int(since or 0) > INFLIGHT_MAX_AGE_MS:
                stale.append(request_id)
            else:
                self.inflight[request_id] = user
                self.inflight_by_user[user] += 1
        if stale:
            self.client.hdel(self.akeys.inflight, *stale)
        self._pending_first = True
        self.loaded = True
        self.loads += 1
        log.info("queue loaded from Redis: %d waiting, %d running", len(self.records),
                 len(self.inflight))  # fmt: skip

    def _queue_in_memory(self, record: dict) -> None:
        self.records[record["id"]] = record
        self.deadlines.push(record["id"], record["deadline"])
        self.cancel_watch.add(record["id"])
        if record["charged"]:
            self.fq.push(Entry(record["id"], record["user"], record["cost"], record["weight"]))
        else:
            self.deferred.setdefault(record["user"], deque()).append(record["id"])

    # -- intake: decide each new request -----------------------------------------------------

    def intake(self, *, block_ms: int) -> int:
        if self._pending_first:
            # What the previous holder had read but not decided: it comes first.
            response = self.client.xreadgroup(
                DISPATCHER_GROUP, ACTIVE_CONSUMER, {self.keys.admit: "0"}, count=self.options.batch
            )
            entries = response[0][1] if response else []
            if len(entries) < self.options.batch:
                self._pending_first = False
            if entries:
                return self.decide(entries)
        response = self.client.xreadgroup(
            DISPATCHER_GROUP, ACTIVE_CONSUMER, {self.keys.admit: ">"},
            count=self.options.batch, block=block_ms,
        )  # fmt: skip
        entries = response[0][1] if response else []
        return self.decide(entries) if entries else 0

    def decide(self, entries: list[tuple[str, dict]]) -> int:
        now = self.now_ms()
        metrics = MetricsBatch()
        level = self.degradation
        to_charge: list[tuple[dict, list]] = []
        queued: list[dict] = []
        rejected: list[tuple[dict, str, int | None]] = []
        entry_ids = [entry_id for entry_id, _ in entries]
        buckets_of: dict[tuple, list] = {}  # most of a batch shares a plan and a size
        for entry_id, fields in entries:
            plan = self.plans.for_user(fields.get("user_id", ""))
            record = self._record_from(entry_id, fields, plan, now)
            if record is None:
                continue
            metrics.latency(now - record["submitted"])
            if level.reject_lowest_plan and self.plans.is_lowest(plan):
                rejected.append((record, outcomes.shed(retry_after=level.retry_after),
                                 level.retry_after))  # fmt: skip
                continue
            if record["user"] in self.deferred:  # held by its rate: later ones wait behind
                record["retry_at"] = self._user_retry_at(record["user"])
                queued.append(record)
                continue
            size = (plan.slug, record["cost"], record["kind"])
            if size not in buckets_of:
                buckets_of[size] = plan_buckets(
                    plan, tokens=record["cost"], requests=plan.cost_weight(record["kind"])
                )
            to_charge.append((record, buckets_of[size]))
        pending = self.buckets.take_in_background(
            [(self.akeys.bucket(r["user"]), b) for r, b in to_charge], now_ms=self._bucket_now()
        )
        # While Redis runs the script, encode the queue records as charged, the usual outcome
        # (this is most of the Python work of a batch); the others are redone below.
        encoded = {record["id"]: json.dumps(record) for record in queued}
        for record, _ in to_charge:
            record["charged"] = True
            encoded[record["id"]] = json.dumps(record)
        decisions = pending.result()
        charged = []
        for (record, buckets), decision in zip(to_charge, decisions, strict=True):
            remaining_ms = record["deadline"] - now
            if decision.code != TAKEN:
                record["charged"] = False
            if decision.code == TAKEN:
                charged.append(record)
                queued.append(record)
            elif decision.code == NEVER:
                limit = next(b.capacity for b in buckets if b.name == decision.bucket)
                rejected.append((record, outcomes.too_large(tokens=record["cost"], limit=limit),
                                 None))  # fmt: skip
            elif decision.wait_ms < remaining_ms:
                record["retry_at"] = now + decision.wait_ms
                record["reason"] = outcomes.waiting_reason(
                    bucket=decision.bucket, wait_s=decision.wait_ms / 1000
                )
                encoded[record["id"]] = json.dumps(record)
                queued.append(record)
                self.deferred.setdefault(record["user"], deque())  # later ones queue behind
            else:
                wait_s = decision.wait_ms / 1000
                rejected.append((record, outcomes.rate_limited(bucket=decision.bucket,
                                 wait_s=wait_s), int(wait_s) + 1))  # fmt: skip
        metrics.count("admitted", len(charged))
        metrics.count("rejected", len(rejected))
        pipe = self.client.pipeline(transaction=True)
        # A charged request's charge lives in its queue record until it leaves the queue; it
        # moves to the charges hash then (release, sweep), in the same MULTI.
        if queued:
            pipe.hset(self.akeys.queue, mapping={r["id"]: encoded[r["id"]] for r in queued})
            pipe.expire(self.akeys.queue, QUEUE_TTL)
        for record, error, retry_after in rejected:
            outcomes.request_end(pipe, self.keys, record, state=State.FAILED, error=error,
                                 retry_after=retry_after)  # fmt: skip
        pipe.xack(self.keys.admit, DISPATCHER_GROUP, *entry_ids)
        pipe.xdel(self.keys.admit, *entry_ids)
        metrics.write(pipe, self.akeys.metrics)
        pipe.execute()
        for record in queued:
            self._queue_in_memory(record)
        return len(entries)

    def _bucket_now(self) -> int | None:
        return self.bucket_clock() if self.bucket_clock else None

    def _user_retry_at(self, user: str) -> int:
        ids = self.deferred.get(user)
        if ids:
            return self.records[ids[0]].get("retry_at", 0)
        return self.now_ms()

    def _record_from(self, entry_id: str, fields: dict, plan, now: int) -> dict | None:
        try:
            request_id = fields["id"]
            user = fields["user_id"]
            max_tokens = int(fields["max_tokens"])
            pte = int(fields.get("prompt_tokens_estimate") or 0)
            submitted = int(fields.get("submitted_ms") or now)
        except (KeyError, ValueError) as exc:
            log.error("dropping malformed admission entry %s: %s", entry_id, exc)
            return None
        cap = plan.max_tokens_cap
        if self.degradation.cap_max_tokens:
            cap = min(cap, self.degradation.cap_max_tokens)
        max_tokens = max(1, min(max_tokens, cap))
        fields = {**fields, "max_tokens": str(max_tokens), "plan": plan.slug}
        return {
            "id": request_id, "user": user, "conv": fields.get("conversation_id", ""),
            "kind": fields.get("kind") or "chat", "plan": plan.slug, "pte": pte,
            "max_tokens": max_tokens, "cost": pte + max_tokens, "weight": plan.priority_weight,
            "charged": False, "retry_at": 0, "submitted": submitted, "enq": now,
            "deadline": submitted + plan.max_queue_wait_seconds * 1000, "seq": time.time_ns(),
            "told": 0, "fields": fields,
        }  # fmt: skip

    # -- requests held by their plan's rate ------------------------------------------------------

    def retry_deferred(self) -> None:
        now = self.now_ms()
        due = [ids[0] for ids in self.deferred.values()
               if ids and self.records[ids[0]]["retry_at"] <= now]  # fmt: skip
        # Users left in `deferred` with nothing held are markers set during one intake batch.
        for user in [u for u, ids in self.deferred.items() if not ids]:
            del self.deferred[user]
        if not due:
            return
        records = [self.records[i] for i in due]
        batch = []
        for record in records:
            plan = self.plans.for_user(record["user"])
            buckets = plan_buckets(
                plan, tokens=record["cost"], requests=plan.cost_weight(record["kind"])
            )
            batch.append((self.akeys.bucket(record["user"]), buckets))
        decisions = self.buckets.take(batch, now_ms=self._bucket_now())
        pipe = self.client.pipeline(transaction=True)
        moved, ended = [], []
        for record, decision, (_, buckets) in zip(records, decisions, batch, strict=True):
            if decision.code == TAKEN:
                record["charged"] = True
                record.pop("reason", None)
                record["seq"] = time.time_ns()  # joins the fair queue now
                moved.append(record)
            elif decision.code == NEVER:
                limit = next(b.capacity for b in buckets if b.name == decision.bucket)
                ended.append(record)
                outcomes.request_end(
                    pipe,
                    self.keys,
                    record,
                    state=State.FAILED,
                    error=outcomes.too_large(tokens=record["cost"], limit=limit),
                )
            else:
                record["retry_at"] = now + decision.wait_ms
            if decision.code != NEVER:
                pipe.hset(self.akeys.queue, record["id"], json.dumps(record))
        for record in ended:
            pipe.hdel(self.akeys.queue, record["id"])
        MetricsBatch(counts={"admitted": len(moved), "rejected": len(ended)}).write(
            pipe, self.akeys.metrics
        )
        pipe.execute()
        for record in moved + ended:
            self.deferred[record["user"]].popleft()
            if not self.deferred[record["user"]]:
                del self.deferred[record["user"]]
        for record in moved:
            self.fq.push(Entry(record["id"], record["user"], record["cost"], record["weight"]))
        for record in ended:
            del self.records[record["id"]]

    # -- cancels and deadlines --------------------------------------------------------------------

    def sweep(self) -> None:
        """Ends waiting requests whose user pressed stop or whose wait ran out. Touches the
        stops noted in the cancel set, a bounded slice of cancel flags and the deadlines that
        are due: not the whole queue."""
        noted = self.client.smembers(self.akeys.cancels)
        cancelled = {i for i in noted if i in self.records} | self._flagged()
        now = self.now_ms()
        late = [i for i in self.deadlines.due(now, self.records) if i not in cancelled]
        if not cancelled and not late and not noted:
            return
        pipe = self.client.pipeline(transaction=True)
        for request_id in cancelled:
            outcomes.request_end(pipe, self.keys, self.records[request_id], state=State.CANCELLED)
        for request_id in late:
            record = self.records[request_id]
            waited = (now - record["submitted"]) / 1000
            outcomes.request_end(pipe, self.keys, record, state=State.FAILED,
                                 error=outcomes.timed_out(waited_s=waited),
                                 retry_after=60)  # fmt: skip
        ended = [*cancelled, *late]
        if ended:
            pipe.hdel(self.akeys.queue, *ended)
            self._hand_over_charges(pipe, [self.records[i] for i in ended])
        if noted:
            pipe.srem(self.akeys.cancels, *noted)
        MetricsBatch(counts={"timed_out": len(late), "cancelled": len(cancelled)}).write(
            pipe, self.akeys.metrics
        )
        pipe.execute()
        for request_id in ended:
            self._forget(request_id)

    def _flagged(self) -> set[str]:
        """Waiting requests with a cancel flag, among this sweep's slice of the queue."""
        ids = self.cancel_watch.next_slice(self.options.cancel_checks, self.records)
        # MGET in chunks: one command per 500 requests costs far less than one EXISTS each.
        # (On a Redis Cluster the cancel keys of different requests live in different slots:
        # there this needs one MGET per slot.)
        flags = []
        for i in range(0, len(ids), 500):
            flags.extend(self.client.mget([self.keys.cancel(r) for r in ids[i : i + 500]]))
        return {i for i, flag in zip(ids, flags, strict=True) if flag}

    def _hand_over_charges(self, pipe, records: list[dict]) -> None:
        """Leaving the queue, a charged request's charge moves to the charges hash, where the
        recorder's completion finds it to refund what was not used."""
        charges = {r["id"]: _charge(r) for r in records if r["charged"]}
        if charges:
            pipe.hset(self.akeys.charges, mapping=charges)
            pipe.expire(self.akeys.charges, QUEUE_TTL)

    def _forget(self, request_id: str) -> None:
        record = self.records.pop(request_id)
        if record["charged"]:
            self.fq.remove(request_id)
        else:
            held = self.deferred.get(record["user"])
            if held is not None:
                held.remove(request_id)
                if not held:
                    del self.deferred[record["user"]]

    # -- release to workers --------------------------------------------------------------------

    def refresh_fleet(self) -> Fleet:
        """The live workers and how much work waits on their streams. Heartbeats change every
        few seconds, so they are reread at most every `fleet_interval` (and at once while no
        worker is known); the streams' lengths are read on every call, in one round trip."""
        fleet = self.fleet
        due = self._every("fleet", self.options.fleet_interval)
        if due or not fleet.workers:
            fleet = self._fleet_from_heartbeats()
        streams = [self.keys.work, *(self.keys.work_for(w) for w in fleet.workers)]
        pipe = self.client.pipeline(transaction=False)
        for stream in streams:
            pipe.xlen(stream)
        fleet.stream_len = dict(zip(streams, pipe.execute(), strict=True))
        fleet.queued_on_streams = sum(fleet.stream_len.values())
        self.fleet = fleet
        return fleet

    def _fleet_from_heartbeats(self) -> Fleet:
        now = time.time()
        ids = self.client.zrangebyscore(self.keys.workers, now - 15, "+inf")
        beats = self.client.mget([self.keys.heartbeat(w) for w in ids]) if ids else []
        fleet = Fleet()
        for raw in beats:
            if not raw:
                continue
            beat = json.loads(raw)
            fleet.heartbeats.append(beat)
            if beat.get("healthy", True) and not beat.get("draining"):
                fleet.workers[beat["worker_id"]] = beat
                fleet.slots += int(beat.get("slots") or 0)
        return fleet

    def release(self) -> int:
        if not len(self.fq):
            return 0
        fleet = self.refresh_fleet()
        room = fleet.slots + self.options.prefetch - fleet.queued_on_streams
        if room <= 0:
            return 0
        released = []
        pipe = self.client.pipeline(transaction=True)
        now = self.now_ms()
        while room > 0:
            entry = self.fq.pop(self._may_run)
            if entry is None:
                break
            record = self.records.pop(entry.id)
            stream = self._route(record, fleet)
            fleet.stream_len[stream] = fleet.stream_len.get(stream, 0) + 1
            pipe.xadd(stream, record["fields"])
            pipe.hdel(self.akeys.queue, entry.id)
            pipe.hset(self.akeys.inflight, entry.id, f"{record['user']}|{now}")
            self._dispatched_events(pipe, record, now)
            self.inflight[entry.id] = record["user"]
            self.inflight_by_user[record["user"]] += 1
            released.append(record)
            room -= 1
        if released:
            pipe.expire(self.akeys.inflight, QUEUE_TTL)
            self._hand_over_charges(pipe, released)
            pipe.execute()
        return len(released)

    def _may_run(self, user: str) -> bool:
        return self.inflight_by_user[user] < self.plans.for_user(user).max_concurrent

    def _route(self, record: dict, fleet: Fleet) -> str:
        """The affinity stream of the worker that served this conversation last, when it is
        live and has a slot for it; else the shared stream."""
        worker_id = self.affinity.get(record["conv"])
        beat = fleet.workers.get(worker_id) if worker_id else None
        if beat is not None:
            stream = self.keys.work_for(worker_id)
            if fleet.stream_len.get(stream, 0) + int(beat.get("busy") or 0) < int(beat["slots"]):
                return stream
        return self.keys.work

    def _dispatched_events(self, pipe, record: dict, now: int) -> None:
        request_key = self.keys.request(record["id"])
        pipe.hset(request_key, mapping={"state": State.DISPATCHED, "updated_ms": now})
        pipe.expire(request_key, protocol.REQUEST_TTL_SECONDS)
        out_key = self.keys.output(record["id"])
        pipe.xadd(out_key, protocol.status_event(State.DISPATCHED),
                  maxlen=protocol.OUTPUT_MAXLEN, approximate=True)  # fmt: skip
        pipe.expire(out_key, protocol.OUTPUT_TTL_SECONDS)

    # -- positions -------------------------------------------------------------------------------

    def tell_positions(self) -> int:
        """Pushes "#n in line (about t s)" to waiting requests whose position changed: the head
        of the line at every pass; the rest when the whole order is recomputed, which takes at
        most `position_share` of the dispatcher's time (every pass for a short queue, every few
        seconds for tens of thousands). See positions.py for who hears first."""
        if not self.records:
            return 0
        now = self.now_ms()
        started = time.monotonic()
        whole = started >= self._due.get("order", 0)
        order = self._line() if whole else self._line_head()
        chosen = positions_to_tell(order, self.records, now_ms=now,
                                   limit=self.options.position_pushes)  # fmt: skip
        told = self._push_positions(chosen, now)
        if whole:
            # Spent s of every s / share: at share 1 the next pass recomputes it again.
            spent = time.monotonic() - started
            self._due["order"] = started + spent / self.options.position_share
        return told

    def _line(self) -> list[str]:
        """Every waiting request in release order; those held by their plan's rate last."""
        order = self.fq.release_order()
        for user_ids in self.deferred.values():
            order.extend(user_ids)
        return order

    def _line_head(self) -> list[str]:
        order = [entry.id for entry in itertools.islice(self.fq.order(), HEAD)]
        for user_ids in self.deferred.values():
            if len(order) >= HEAD:
                break
            order.extend(itertools.islice(user_ids, HEAD - len(order)))
        return order

    def _push_positions(self, chosen: list[tuple[int, str]], now: int) -> int:
        if not chosen:
            return 0
        slots = max(1, self.fleet.slots)
        pipe = self.client.pipeline(transaction=False)
        first_told = 0
        for position, request_id in chosen:
            record = self.records[request_id]
            eta = position / slots * self.avg_service_s
            extra = {}
            if not record["charged"]:
                eta = max(eta, (record["retry_at"] - now) / 1000)
                extra["reason"] = record.get("reason", "")
            if not record.get("told"):
                first_told += 1
            record["told"], record["told_at"] = position, now
            out_key = self.keys.output(request_id)
            pipe.xadd(out_key, protocol.status_event(State.QUEUED, position=position,
                      eta_seconds=max(1, round(eta)), **extra),
                      maxlen=protocol.OUTPUT_MAXLEN, approximate=True)  # fmt: skip
            pipe.expire(out_key, protocol.OUTPUT_TTL_SECONDS)
        if first_told:
            MetricsBatch(counts={"queued": first_told}).write(pipe, self.akeys.metrics)
        pipe.execute()
        return len(chosen)

    # -- completions (called by the recorder for each finished request) ------------------------

    def on_completion(self, completion: Completion) -> None:
        self.on_completions([completion])

    def on_completions(self, completions: list[Completion]) -> None:
        """Reconciles estimates with the real usage, frees the users' concurrency slots and
        remembers which worker holds each conversation's prefix. A batch costs three round
        trips whatever its size: the charges read, their removal with the metrics, the refunds.
        """
        if not completions:
            return
        ids = [c.id for c in completions]
        charges = self.client.hmget(self.akeys.charges, ids)
        tokens: Counter[str] = Counter()
        refunds = []
        for completion, charge_raw in zip(completions, charges, strict=True):
            self._completed(completion)
            if not charge_raw:
                continue
            charge = json.loads(charge_raw)
            real = completion.usage.prompt_tokens + completion.usage.completion_tokens
            tokens[charge["plan"]] += real
            delta = charge["tokens"] - real  # positive: refund what was not used
            if delta:
                plan = self.plans.for_user(charge["user"])
                buckets = [b for b in plan_buckets(plan, tokens=delta, requests=0)
                           if b.name != "req"]  # fmt: skip
                refunds.append((self.akeys.bucket(charge["user"]), buckets))
        pipe = self.client.pipeline(transaction=False)
        pipe.hdel(self.akeys.charges, *ids)
        pipe.hdel(self.akeys.inflight, *ids)
        if tokens:
            MetricsBatch(tokens=dict(tokens)).write(pipe, self.akeys.metrics)
        pipe.execute()
        self.buckets.adjust(refunds, now_ms=self._bucket_now())

    def _completed(self, completion: Completion) -> None:
        user = self.inflight.pop(completion.id, None)
        if user is not None:
            self.inflight_by_user[user] -= 1
            if self.inflight_by_user[user] <= 0:
                del self.inflight_by_user[user]
        if completion.worker_id:
            self.affinity[completion.conversation_id] = completion.worker_id
            self.affinity.move_to_end(completion.conversation_id)
            if len(self.affinity) > AFFINITY_MAX:
                self.affinity.popitem(last=False)
        duration = completion.usage.duration_ms
        if completion.state == State.DONE and duration:
            self.avg_service_s = 0.8 * self.avg_service_s + 0.2 * duration / 1000

    # -- degradation ---------------------------------------------------------------------------

    def publish_degradation(self) -> Degradation:
        self.degradation = degradation_compute(
            settings=self.plans.degradation, backlog=len(self.records),
            cpu_percent=host_cpu_percent(), gpu_percent=gpu_memory_percent(self.fleet.heartbeats),
        )  # fmt: skip
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.akeys.degradation, self.degradation.to_json(), ex=STATE_TTL_SECONDS)
        pipe.hset(self.akeys.metrics, mapping={
            "gauge:workers": len(self.fleet.workers), "gauge:slots": self.fleet.slots,
            "gauge:running": len(self.inflight), "gauge:service_seconds": self.avg_service_s,
        })  # fmt: skip
        pipe.execute()
        return self.degradation


def _charge(record: dict) -> str:
    return json.dumps({"user": record["user"], "plan": record["plan"], "tokens": record["cost"]})
