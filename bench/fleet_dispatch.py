"""The dispatcher inside bench/fleet_model.py: the product's own release pass, run on the model's
state instead of Redis.

What runs is apps/admission's code as the dispatcher composes it (dispatcher.py): requests
join a `Line` (its fair queue, weighted by the estimated cost from the `Estimator`) as intake
makes them (`kind_decide`, the plan's priority and cost weights); `Release.run` hands them out
within each user's `max_concurrent` and `max_background_concurrent` (`Running`, `PlanBook`)
and the fleet's room, reading the fleet through `FleetView` and routing with its `Router` over
the `AffinityStore`; answers settle the user's running count, teach affinity, service time and
the estimator. Only Redis is replaced: `ModelRedis` answers the fleet reads (heartbeats as old
as the workers' last beat, the work streams' lengths and pending entries as they stand) from
the simulated workers, and hands each work-stream XADD of a release to the model's streams.
The clock `FleetView` reads (its heartbeat reread interval) is the simulation's.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from django.conf import settings

from apps.admission.estimates import Estimator, Sample, question_of
from apps.admission.kinds import BACKGROUND, RAG, kind_decide
from apps.admission.line import Line, QueuedRequest
from apps.admission.models import Plan
from apps.admission.plans import PlanBook
from apps.admission.release import FleetView, Release
from apps.admission.routing import Router
from apps.admission.running import Running
from contract.protocol import Answer, Keys, State, Usage


def model_plan(max_concurrent: int | None = None) -> Plan:
    """The plan every model user is on: the default plan's limits on what runs at once (its
    rates and quotas are admission's, which the model leaves out)."""
    plan = Plan(slug="default", name="Default", is_default=True)
    if max_concurrent:
        plan.max_concurrent = max_concurrent
    return plan


class ModelRedis:
    """The Redis commands the release pass and FleetView send, answered from the model."""

    def __init__(self, keys: Keys, model: str, workers: list, dispatched: Callable) -> None:
        self.keys = keys
        self.workers = {w.id: w for w in workers}
        self.shared_key = keys.work_for_model(model)
        self.private = {keys.work_for(w.id): w for w in workers}
        self.beats = {keys.heartbeat(w.id): w for w in workers}
        self.data: dict[str, str] = {}  # affinity entries
        self.dispatched = dispatched  # (stream, fields) for each work-stream XADD
        self.shared_waiting = 0  # set by the model before each pass

    def pipeline(self, transaction: bool = False) -> _Pipe:
        return _Pipe(self)

    def mget(self, names):
        return [self._get(n) for n in names]

    def _get(self, name: str):
        worker = self.beats.get(name)
        return worker.heartbeat() if worker is not None else self.data.get(name)

    def apply(self, command: str, args: tuple, kwargs: dict):
        if command == "mget":
            return self.mget(args[0])
        if command == "set":
            self.data[args[0]] = args[1]
            return True
        if command == "zrangebyscore":
            return [w.id for w in self.workers.values() if w.beat_at >= float(args[1])]
        if command == "xlen":
            return self._xlen(args[0])
        if command == "xpending":
            return self._xpending(args[0])
        if command == "xadd":
            self.dispatched(args[0], args[1])
            return "0-1"
        if command in ("hset", "hdel", "expire", "eval"):  # the line's and requests' records
            return 1
        raise NotImplementedError(f"the fleet model has no {command}")

    def _xlen(self, stream: str) -> int:
        worker = self.private.get(stream)
        if worker is not None:  # acknowledged entries are deleted: waiting + running
            return len(worker.queue) + worker.from_private
        if stream == self.shared_key:
            return self.shared_waiting + sum(w.from_shared for w in self.workers.values())
        return 0

    def _xpending(self, stream: str) -> dict:
        worker = self.private.get(stream)
        if worker is not None:
            return {"pending": worker.from_private, "consumers": []}
        consumers = [{"name": w.id, "pending": w.from_shared} for w in self.workers.values()]
        return {"pending": sum(c["pending"] for c in consumers), "consumers": consumers}


class _Pipe:
    def __init__(self, owner: ModelRedis) -> None:
        self.owner = owner
        self.commands: list[tuple[str, tuple, dict]] = []

    def __len__(self) -> int:
        return len(self.commands)

    def __getattr__(self, command: str):
        def queue(*args, **kwargs):
            self.commands.append((command, args, kwargs))
            return self

        return queue

    def execute(self, raise_on_error: bool = True) -> list:
        commands, self.commands = self.commands, []
        return [self.owner.apply(c, a, k) for c, a, k in commands]


class SimClock:
    """`time` as apps/admission/release.py reads it, on the simulation's clock."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now()

    def time(self) -> float:
        return self.now()


class Dispatch:
    """One dispatcher's line, running counts, plans, fleet view and release pass."""

    def __init__(
        self,
        *,
        workers: list,
        model: str,
        policy: str,
        max_load: float,
        read_s: float,
        plan: Plan,
        now: Callable[[], float],
        dispatched: Callable,
    ) -> None:
        keys = Keys(prefix="fleet-model")
        self.keys, self.model, self.plan, self.now = keys, model, plan, now
        self.redis = ModelRedis(keys, model, workers, dispatched)
        self.line = Line(keys, quantum=settings.SLUICE_ADMISSION_QUANTUM)
        self.running = Running(keys)
        self.plans = PlanBook()
        self.plans.default = plan
        self.plans.plans = {plan.id: plan}
        self.view = FleetView(self.redis, keys, interval=read_s, clock=SimClock(now))
        self.view.router = Router(keys, self.view.affinity, policy=policy, max_load=max_load)
        self.estimator = Estimator(keys)
        self.release = Release(
            client=self.redis,
            keys=keys,
            line=self.line,
            running=self.running,
            plans=self.plans,
            fleet=self.view,
            now_ms=lambda: int(now() * 1000),
            prefetch=settings.SLUICE_ADMISSION_PREFETCH,
        )
        self.requests: dict[str, QueuedRequest] = {}
        self.queued_ns = 0

    def submit(self, *, job_id: str, kind: str, user: str, conversation: str, messages) -> None:
        """The request as intake makes it (charged: the model has no buckets to wait on)."""
        plan, now_ms = self.plan, int(self.now() * 1000)
        encoded = json.dumps(messages)
        prompt_tokens = sum(len(m["content"]) for m in messages) // 4
        kind = kind_decide(
            submitted=RAG if kind == "chat" else BACKGROUND if kind == BACKGROUND else "api",
            prompt_tokens=prompt_tokens,
            long_prompt_tokens=plan.long_prompt_tokens,
        )
        self.queued_ns += 1
        max_tokens = min(512, plan.max_tokens_cap)
        request = QueuedRequest(
            job_id,
            user,
            conversation,
            kind,
            plan.slug,
            prompt_tokens,
            max_tokens,
            plan.priority_weight,
            now_ms,
            now_ms + plan.max_queue_wait_seconds * 1000,
            self.queued_ns,
            True,
            0,
            "",
            {"id": job_id, "messages": encoded, "model": self.model},
        )
        request.kind_weight = plan.cost_weight(kind)
        guess = self.estimator.guess(
            kind=kind,
            user_id=user,
            plan=plan.slug,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            question=question_of(encoded),
        )
        request.estimate, request.features = guess.tokens, guess.x
        self.requests[job_id] = request
        self.line.add(request)

    def run(self, shared_waiting: int) -> int:
        """One release pass; returns how many requests it handed out."""
        self.redis.shared_waiting = shared_waiting
        return self.release.run()

    def held(self) -> int:
        """Requests in line although the fleet has room: their user's limit holds them."""
        return len(self.line)

    def settled(self, job_id: str, *, worker_id: str, tokens: int, duration_s: float) -> None:
        request = self.requests.pop(job_id)
        answer = Answer(
            id=job_id,
            user_id=request.user_id,
            conversation_id=request.conversation_id,
            state=State.DONE,
            worker_id=worker_id,
            usage=Usage(completion_tokens=tokens, duration_ms=duration_s * 1000),
            attempt=1,
        )
        self.view.learn(answer)
        self.running.settled(self.redis.pipeline(), [job_id])
        self.estimator.learn(
            [
                Sample(
                    x=request.features,
                    guessed=request.estimate or request.max_tokens,
                    max_tokens=request.max_tokens,
                    user_id=request.user_id,
                    plan=request.plan,
                    real=tokens,
                )
            ]
        )
