"""A discrete-event model of a fleet under one routing policy, in simulated time, so a load sweep
per policy fits in minutes on two cores. What decides is product code where Sluice decides:

- each worker's timing and prefix cache are worker/engines/simulated.py's (its cache lookup and
  its batch slowdown, called on an engine object per worker);
- `pull` and `affinity` release work as apps/admission/release.py does (only into free slots,
  plus the work waiting for a full worker, in arrival order) and route it with
  apps/admission/routing.py's Router over affinity.py's AffinityStore (on a dict in place of
  Redis), reading the workers' load from heartbeats as old as the dispatcher sees them
  (workers beat every 2 s, the dispatcher rereads every 0.5 s) and the streams' lengths fresh;
- the baselines are what a load balancer in front of the workers does, with its own exact
  counts of open requests: `least-conn` (fewest open requests), `weighted-rr` (smooth weighted
  round robin, weights = each worker's measured speed x slots), `sticky` (consistent hashing
  on a ring of 160 points per unit of weight, keyed by conversation, by API key for API
  requests). Each worker runs what it was sent in order, as many at once as it has slots.

Every arrival is counted: done, timed out (no first token within `timeout_s`) or dropped (a
chat question finds every open conversation waiting for an answer).
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import itertools
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

from fleet_prompts import Ask, Workload, encoded, open_conversations

from apps.admission.affinity import AffinityStore
from apps.admission.routing import AFFINITY, PULL, Router
from worker.engines.simulated import SimulatedEngine
from worker.protocol import Keys

BASELINES = ("least-conn", "weighted-rr", "sticky")
# Affinity as it was: a full worker's queue took work up to 2.5 x its slots, its load read from
# heartbeats alone.
BEFORE = "affinity-2.5"
# No policy's bound: pull, with every worker holding every prefix any worker ever computed (one
# unbounded cache shared by all), so each prompt reads only what no earlier prompt began with.
IDEAL = "ideal-cache"
POLICIES = (*BASELINES, PULL, AFFINITY, BEFORE, IDEAL)
MODEL = "m"


@dataclass
class Fleet:
    """The GPU model: milliseconds per step at speed 1 (worker 0 runs at half speed)."""

    workers: int = 8
    slots: int = 4
    first_token_ms: float = 20.0
    prefill_ms: float = 0.4  # per prompt token the prefix cache does not hold
    decode_ms: float = 25.0
    slowdown: float = 0.04  # per extra running sequence
    kv_tokens: int = 16_000
    beat_s: float = 2.0
    fleet_read_s: float = 0.5
    max_load: float = 1.0  # SLUICE_AFFINITY_MAX_LOAD (bench/fleet.py passes the setting's)
    busy_fresh: bool = True  # the dispatcher also counts running work from pending entries

    def speed(self, index: int) -> float:
        return 0.5 if index == 0 else 1.0


@dataclass
class Job:
    id: str
    ask: Ask
    arrived: float
    measured: bool
    fields: dict = field(default_factory=dict)  # what the Router reads, as a QueuedRequest
    conversation_id: str = ""
    first: float | None = None
    ended: float | None = None
    prompt: int = 0
    cached: int = 0


class Worker:
    def __init__(self, index: int, fleet: Fleet) -> None:
        self.id = f"fw{index}"
        self.slots = fleet.slots
        self.speed = fleet.speed(index)
        self.engine = SimulatedEngine(
            slots=fleet.slots,
            first_token_ms=fleet.first_token_ms,
            decode_ms_per_token=fleet.decode_ms,
            prefill_ms_per_token=fleet.prefill_ms,
            batch_slowdown=fleet.slowdown,
            kv_capacity_tokens=fleet.kv_tokens,
            speed=self.speed,
        )
        self.running = 0
        self.queue: deque[Job] = deque()  # pushed to it, or on its affinity stream
        self.beat_busy = 0  # what its last heartbeat said
        self.fresh = fleet.busy_fresh
        # Redis serves the reader blocked longest first, and a worker that took an entry
        # blocks again behind the others: the shared stream goes round the free workers.
        self.read_at = 0.0

    def beat(self) -> dict:
        busy = max(self.running, self.beat_busy) if self.fresh else self.beat_busy
        return {"worker_id": self.id, "slots": self.slots, "busy": busy, "model": MODEL}


class DictRedis:
    """The few Redis calls AffinityStore makes, on a dict (its TTLs never pass in a run)."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def mget(self, names):
        return [self.data.get(n) for n in names]

    def pipeline(self, transaction: bool = False):
        return _Pipe(self)


class _Pipe:
    def __init__(self, owner: DictRedis) -> None:
        self.owner, self.sets = owner, []

    def set(self, key, value, ex=None):
        self.sets.append((key, value))

    def execute(self, raise_on_error=True):
        self.owner.data.update(self.sets)
        return [True] * len(self.sets)


class Ring:
    """Consistent hashing with points per worker in proportion to its weight."""

    def __init__(self, weights: dict[str, float], points: int = 160) -> None:
        ring = sorted(
            (_hash(f"{w}#{i}"), w)
            for w, weight in weights.items()
            for i in range(max(1, round(points * weight)))
        )
        self.hashes = [h for h, _ in ring]
        self.owners = [w for _, w in ring]

    def owner(self, key: str) -> str:
        return self.owners[bisect.bisect(self.hashes, _hash(key)) % len(self.owners)]


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class Simulation:
    def __init__(
        self,
        *,
        policy: str,
        fleet: Fleet,
        rate: float,
        seconds: float,
        warmup: float,
        think_s: float,
        layout: str,
        seed: int,
        timeout_s: float = 60.0,
        users: int = 400,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy is one of {', '.join(POLICIES)}, not {policy!r}")
        if policy == BEFORE:
            fleet = replace(fleet, max_load=2.5, busy_fresh=False)
        self.policy, self.fleet, self.rate = policy, fleet, rate
        self.start, self.end = warmup, warmup + seconds
        self.timeout_s = timeout_s
        self.rng = random.Random(seed)  # arrivals: the same for every policy
        self.ties = random.Random(seed + 2)  # a balancer's own draws
        active = open_conversations(rate, think_s)
        self.workload = Workload(
            rng=random.Random(seed + 1), active=active, users=users, layout=layout
        )
        self.workers = [Worker(i, fleet) for i in range(fleet.workers)]
        if policy == IDEAL:
            everything = OrderedDict()
            for worker in self.workers:
                worker.engine.prefix_cache = everything
                worker.engine.kv_capacity_tokens = 0
                worker.engine.prefix_cache_entries = 10**12
        self.by_id = {w.id: w for w in self.workers}
        self.keys = Keys(prefix="fleet-model")
        self.store = AffinityStore(DictRedis(), self.keys, ttl_seconds=1800)
        self.router = Router(
            self.keys,
            self.store,
            policy=policy if policy in (PULL, AFFINITY) else AFFINITY if policy == BEFORE else PULL,
            max_load=fleet.max_load,
        )
        self.line: deque[Job] = deque()  # the dispatcher's queue (pull, affinity)
        self.shared: deque[Job] = deque()  # the model's shared stream
        weights = {w.id: w.speed * w.slots for w in self.workers}
        self.ring = Ring(weights)
        self.wrr = {w: 0.0 for w in weights}
        self.weights = weights
        self.events: list = []
        self.seq = itertools.count()
        self.jobs: list[Job] = []
        self.dropped = 0
        self.now = 0.0
        self.beats: dict[str, dict] = {w.id: w.beat() for w in self.workers}

    # -- the event loop ---------------------------------------------------------------------------

    def at(self, when: float, kind: str, item=None) -> None:
        heapq.heappush(self.events, (when, next(self.seq), kind, item))

    def run(self) -> dict:
        self.at(self.rng.expovariate(self.rate), "arrive")
        for i, worker in enumerate(self.workers):  # beats out of step, as real workers' are
            self.at(self.fleet.beat_s * (i + 1) / len(self.workers), "beat", worker)
        self.at(self.fleet.fleet_read_s, "read")
        stop = self.end + self.timeout_s
        while self.events:
            when, _, kind, item = heapq.heappop(self.events)
            if when > stop:
                break
            self.now = when
            if kind == "arrive":
                self.arrive()
            elif kind == "first":
                item.first = when
            elif kind == "end":
                self.finish(item)
            elif kind == "beat":
                item.beat_busy = item.running
                self.at(when + self.fleet.beat_s, "beat", item)
            elif kind == "read":
                self.beats = {w.id: w.beat() for w in self.workers}
                self.release()
                self.at(when + self.fleet.fleet_read_s, "read")
            if self.now > self.end and not self.unfinished():
                break
        return self.figures()

    def unfinished(self) -> bool:
        return any(j.measured and j.ended is None for j in self.jobs)

    def arrive(self) -> None:
        if self.now < self.end:
            self.at(self.now + self.rng.expovariate(self.rate), "arrive")
        else:
            return
        ask = self.workload.next()
        if ask is None:
            self.dropped += self.start <= self.now
            return
        self.submit(ask)
        for background in self.workload.background:
            self.submit(background)
        self.workload.background.clear()

    def submit(self, ask: Ask) -> None:
        measured = ask.kind != "background" and self.start <= self.now
        job = Job(
            f"r{len(self.jobs)}",
            ask,
            self.now,
            measured,
            {"messages": encoded(ask.messages)},
            ask.conversation,
        )
        self.jobs.append(job)
        if self.policy in BASELINES:
            self.push(job)
        else:
            self.line.append(job)
            self.release()

    # -- routing ----------------------------------------------------------------------------------

    def push(self, job: Job) -> None:
        if self.policy == "least-conn":
            load = {w.id: w.running + len(w.queue) for w in self.workers}
            low = min(load.values())
            chosen = self.ties.choice([w for w, n in load.items() if n == low])
        elif self.policy == "weighted-rr":  # nginx's smooth weighted round robin
            total = sum(self.weights.values())
            for w in self.wrr:
                self.wrr[w] += self.weights[w]
            chosen = max(self.wrr, key=self.wrr.__getitem__)
            self.wrr[chosen] -= total
        else:
            chosen = self.ring.owner(job.ask.conversation or f"key:{job.ask.user}")
        worker = self.by_id[chosen]
        worker.queue.append(job)
        self.fill(worker)

    def release(self) -> None:
        """release.py's pass: the fleet's free slots (less the work waiting on its streams,
        plus the work waiting for a worker that is full) take the oldest requests."""
        if not self.line:
            return
        if self.fleet.busy_fresh:
            self.beats = {w.id: w.beat() for w in self.workers}
        queued = sum(w.running + len(w.queue) for w in self.workers) + len(self.shared)
        overbooked = sum(
            max(0, self.beats[w.id]["busy"] + len(w.queue) - w.slots) for w in self.workers
        )
        room = sum(w.slots for w in self.workers) - queued + overbooked
        picked = [self.line.popleft() for _ in range(min(room, len(self.line)))]
        if not picked:
            return
        waiting = {w.id: len(w.queue) for w in self.workers}
        streams = self.router.route([(job, MODEL) for job in picked], self.beats, waiting)
        private = {self.keys.work_for(w.id): w for w in self.workers}
        for job, stream in zip(picked, streams, strict=True):
            if stream in private:
                private[stream].queue.append(job)
            else:
                self.shared.append(job)
        self.fill_all()

    def fill(self, worker: Worker) -> None:
        """A worker with free slots reads its own stream first, then the shared one."""
        while worker.running < worker.slots and worker.queue:
            self.begin(worker, worker.queue.popleft())
        if worker.running < worker.slots and self.shared:
            self.fill_all()

    def fill_all(self) -> None:
        """Each free worker's own stream, then the shared stream's entries one at a time to the
        free worker that has waited longest."""
        for worker in self.workers:
            while worker.running < worker.slots and worker.queue:
                self.begin(worker, worker.queue.popleft())
        while self.shared:
            free = [w for w in self.workers if w.running < w.slots]
            if not free:
                return
            self.begin(min(free, key=lambda w: w.read_at), self.shared.popleft())

    def begin(self, worker: Worker, job: Job) -> None:
        engine = worker.engine
        worker.running += 1
        worker.read_at = self.now
        engine.running = worker.running  # what the engine's batch slowdown reads
        messages = job.ask.messages
        uncached = engine._uncached_prompt_tokens(messages)
        job.prompt = sum(max(1, len(m["content"]) // 4) for m in messages)
        job.cached = job.prompt - uncached
        first = (
            self.now
            + engine._slowed(engine.first_token_ms + engine.prefill_ms_per_token * uncached) / 1000
        )
        decode = (job.ask.tokens - 1) * engine._slowed(engine.decode_ms_per_token) / 1000
        job.worker = worker.id  # type: ignore[attr-defined]
        self.at(first, "first", job)
        self.at(first + decode, "end", job)

    def finish(self, job: Job) -> None:
        job.ended = self.now
        worker = self.by_id[job.worker]  # type: ignore[attr-defined]
        worker.running -= 1
        worker.read_at = self.now  # it reads again, behind the workers already waiting
        self.store.learn(
            SimpleNamespace(id=job.id, worker_id=worker.id, conversation_id=job.conversation_id)
        )
        self.store.flush()
        self.workload.answered(job.ask)
        self.fill(worker)
        if self.policy not in BASELINES:
            self.release()

    # -- figures ----------------------------------------------------------------------------------

    def figures(self) -> dict:
        measured = [j for j in self.jobs if j.measured]
        bound = self.timeout_s * 1000
        ttft = sorted(
            (j.first - j.arrived) * 1000 if j.first is not None else float("inf") for j in measured
        )
        timed_out = sum(t > bound for t in ttft)
        ran = [j for j in self.jobs if self.start <= j.arrived < self.end and j.first]
        prompt = sum(j.prompt for j in ran)
        p99 = ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))] if ttft else 0.0
        return {
            "policy": self.policy,
            "rate": self.rate,
            "asked": len(measured) + self.dropped,
            "done": len(measured) - timed_out,
            "timed_out": timed_out,
            "dropped": self.dropped,
            "rejected": 0,
            "ttft_p50": ttft[len(ttft) // 2] if ttft else 0.0,
            "ttft_p99": p99,
            "hit": sum(j.cached for j in ran) / prompt if prompt else 0.0,
            "prompt_tokens": prompt / max(1, len(ran)),
        }
