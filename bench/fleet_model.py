"""A discrete-event model of a fleet under one routing policy, in simulated time, so a load sweep
per policy and seed fits in minutes on two cores. What decides is product code where Sluice
decides:

- each worker's timing and prefix cache are worker/engines/simulated.py's (its cache lookup and
  its batch slowdown, called on an engine object per worker);
- `pull` and `affinity` run the dispatcher's own release pass (bench/fleet_dispatch.py): the
  `Line` and its fair queue, the plan's `max_concurrent` through `Running` and `PlanBook`,
  `Release.run`, `FleetView` and its `Router` over the `AffinityStore`, with Redis answered
  from the model: heartbeats as old as the workers' last beat (every 2 s; the view rereads
  them every 0.5 s), the work streams' lengths and pending entries as they stand;
- the baselines are load balancers in front of the workers (bench/fleet_balancers.py): least
  connections, smooth weighted round robin, sticky consistent hashing, and a cache-aware
  balancer with a load bound (SGLang's router, llm-d's prefix scorer; `cache-aware:N` bounds
  its worker's load to N open requests above the least loaded). Each worker runs what it was
  sent in order, as many at once as it has slots.

Two reference rows: `affinity-2.5` (the product's affinity at SLUICE_AFFINITY_MAX_LOAD 2.5, the
setting before 1.0) and `ideal-cache` (the product's affinity with every worker holding every
prefix any worker ever computed: the same scheduler with a cache no routing can beat).

Every arrival is counted: done, timed out (no first token within `timeout_s`) or dropped (a
chat question finds every open conversation waiting for an answer).
"""

from __future__ import annotations

import heapq
import itertools
import json
import random
from collections import OrderedDict, deque
from dataclasses import dataclass

from fleet_balancers import BASELINES, Balancer
from fleet_dispatch import Dispatch, model_plan
from fleet_prompts import Ask, Workload, open_conversations

from apps.admission.routing import AFFINITY, PULL
from worker.engines.simulated import SimulatedEngine

BEFORE = "affinity-2.5"
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
    max_concurrent: int = 0  # the plan's; 0: the default plan's

    def speed(self, index: int) -> float:
        return 0.5 if index == 0 else 1.0


@dataclass
class Job:
    id: str
    ask: Ask
    arrived: float
    measured: bool
    first: float | None = None
    ended: float | None = None
    began: float = 0.0
    prompt: int = 0
    cached: int = 0
    worker: str = ""
    private: bool = True  # read from its worker's own stream (else the shared one)


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
        self.from_private = 0  # of `running`: read from its own stream (pending there)
        self.from_shared = 0
        self.queue: deque[Job] = deque()  # pushed to it, or on its affinity stream
        self.beat_busy = 0  # what its last heartbeat said
        self.beat_at = 0.0
        # Redis serves the reader blocked longest first, and a worker that took an entry
        # blocks again behind the others: the shared stream goes round the free workers.
        self.read_at = 0.0

    def heartbeat(self) -> str:
        return json.dumps(
            {"worker_id": self.id, "slots": self.slots, "busy": self.beat_busy, "model": MODEL}
        )


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
        name, _, bound = policy.partition(":")  # cache-aware:N, N its load bound
        if name not in POLICIES or (bound and not bound.isdigit()):
            raise ValueError(f"policy is one of {', '.join(POLICIES)}, not {policy!r}")
        self.policy, self.fleet, self.rate = policy, fleet, rate
        self.start, self.end = warmup, warmup + seconds
        self.timeout_s = timeout_s
        self.rng = random.Random(seed)  # arrivals: the same for every policy
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
        self.by_job: dict[str, Job] = {}
        self.shared: deque[Job] = deque()  # the model's shared stream
        self.balancer = self.dispatch = None
        if name in BASELINES:
            weights = {w.id: w.speed * w.slots for w in self.workers}
            self.balancer = Balancer(
                name, weights, seed=seed + 2, cache_tokens=fleet.kv_tokens, bound=int(bound or 0)
            )
        else:
            self.dispatch = Dispatch(
                workers=self.workers,
                model=MODEL,
                policy=PULL if policy == PULL else AFFINITY,
                max_load=2.5 if policy == BEFORE else fleet.max_load,
                read_s=fleet.fleet_read_s,
                plan=model_plan(fleet.max_concurrent),
                now=lambda: self.now,
                dispatched=self.dispatched,
            )
            self.private = {self.dispatch.keys.work_for(w.id): w for w in self.workers}
        self.events: list = []
        self.seq = itertools.count()
        self.jobs: list[Job] = []
        self.dropped = 0
        self.now = 0.0

    # -- the event loop ---------------------------------------------------------------------------

    def at(self, when: float, kind: str, item=None) -> None:
        heapq.heappush(self.events, (when, next(self.seq), kind, item))

    def run(self) -> dict:
        return self._run()

    def _run(self) -> dict:
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
                item.beat_busy, item.beat_at = item.running, when
                self.at(when + self.fleet.beat_s, "beat", item)
            elif kind == "read":
                self.release()
                self.at(when + self.fleet.fleet_read_s, "read")
            if self.now > self.end and not self.unfinished():
                break
        return self.figures()

    def unfinished(self) -> bool:
        return any(j.measured and j.ended is None for j in self.jobs)

    def arrive(self) -> None:
        if self.now >= self.end:
            return
        self.at(self.now + self.rng.expovariate(self.rate), "arrive")
        ask = self.workload.next()
        if ask is None:
            self.dropped += self.start <= self.now
            return
        self.submit(ask)
        for background in self.workload.background:
            self.submit(background)
        self.workload.background.clear()
        self.release()

    def submit(self, ask: Ask) -> None:
        measured = ask.kind != "background" and self.start <= self.now
        job = Job(f"r{len(self.jobs)}", ask, self.now, measured)
        self.jobs.append(job)
        self.by_job[job.id] = job
        if self.balancer is not None:
            load = {w.id: w.running + len(w.queue) for w in self.workers}
            key = ask.conversation or f"key:{ask.user}"
            chosen = self.balancer.choose(key=key, messages=ask.messages, load=load)
            worker = self.by_id[chosen]
            worker.queue.append(job)
            self.fill(worker)
        else:
            self.dispatch.submit(
                job_id=job.id,
                kind=ask.kind,
                user=ask.user,
                conversation=ask.conversation,
                messages=ask.messages,
            )

    # -- the dispatcher and the workers -----------------------------------------------------------

    def release(self) -> None:
        if self.dispatch is not None and len(self.dispatch.line):
            if self.dispatch.run(len(self.shared)):
                self.fill_all()

    def dispatched(self, stream: str, fields: dict) -> None:
        """A work-stream XADD of the release pass: the job joins that stream."""
        job = self.by_job[fields["id"]]
        worker = self.private.get(stream)
        if worker is not None:
            worker.queue.append(job)
        else:
            job.private = False
            self.shared.append(job)

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
        if job.private:
            worker.from_private += 1
        else:
            worker.from_shared += 1
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
        job.worker, job.began = worker.id, self.now
        self.at(first, "first", job)
        self.at(first + decode, "end", job)

    def finish(self, job: Job) -> None:
        job.ended = self.now
        worker = self.by_id[job.worker]
        worker.running -= 1
        if job.private:
            worker.from_private -= 1
        else:
            worker.from_shared -= 1
        worker.read_at = self.now  # it reads again, behind the workers already waiting
        if self.dispatch is not None:
            self.dispatch.settled(
                job.id, worker_id=worker.id, tokens=job.ask.tokens, duration_s=self.now - job.began
            )
        self.workload.answered(job.ask)
        self.fill(worker)
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
