"""Release: waiting requests go to workers only as fast as the workers free slots, in fair order,
within each user's max_concurrent, routed to the worker whose KV cache likely holds the
conversation's prefix.

Per model: each model has its own shared work stream, read by the workers that serve it, and its
own room (its workers' slots less the work waiting on its streams). A request that names no
model runs on the default one (`plans.model_choose`), decided as it leaves the line.

The fleet view is what the workers' heartbeats say (live workers and their slots) plus how much
work waits on the work streams; the answers teach it which worker served each conversation last
and how long an answer takes (the ETAs in positions).
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from django.conf import settings

from worker import transitions
from worker.protocol import Answer, Keys, State

from .line import Flow, Line, QueuedRequest
from .models import Plan
from .plans import PlanBook, model_choose
from .running import Running

log = logging.getLogger("sluice.dispatcher")

LIVE_SECONDS = 15  # a worker whose last beat is older is not counted
AFFINITY_MAX = 100_000  # conversations remembered


@dataclass
class Fleet:
    """Live workers as their heartbeats describe them, and the work streams' lengths."""

    slots: int = 0
    queued_on_streams: int = 0
    workers: dict[str, dict] = field(default_factory=dict)  # healthy and not draining
    stream_len: dict[str, int] = field(default_factory=dict)
    heartbeats: list[dict] = field(default_factory=list)  # every fresh one
    model_slots: dict[str, int] = field(default_factory=dict)  # model → its workers' slots

    def queued(self, keys: Keys, model: str) -> int:
        """Work waiting or running on `model`'s streams: its shared one and its workers'."""
        return self.stream_len.get(keys.work_for_model(model), 0) + sum(
            self.stream_len.get(keys.work_for(w), 0) for w, beat in self.workers.items()
            if beat_model(beat) == model
        )  # fmt: skip

    def slots_for(self, model: str) -> int:
        return self.model_slots.get(model, 0)


class FleetView:
    def __init__(self, client: redis.Redis, keys: Keys, *, interval: float) -> None:
        self.client = client
        self.keys = keys
        self.interval = interval
        self.fleet = Fleet()
        self.affinity: OrderedDict[str, str] = OrderedDict()  # conversation → worker
        self.service_s = 10.0  # average time an answer takes
        self.models_seen: set[str] = set()  # every model a live worker has served
        self._read_at = 0.0

    def refresh(self) -> Fleet:
        """The live workers and how much work waits on their streams. Heartbeats change every
        few seconds, so they are reread at most every `interval` (and at once while no worker
        is known); the streams' lengths are read on every call, in one round trip."""
        fleet = self.fleet
        now = time.monotonic()
        if now >= self._read_at or not fleet.workers:
            self._read_at = now + self.interval
            fleet = self._from_heartbeats()
        streams = [*(self.keys.work_for_model(m) for m in fleet.model_slots),
                   *(self.keys.work_for(w) for w in fleet.workers)]  # fmt: skip
        pipe = self.client.pipeline(transaction=False)
        for stream in streams:
            pipe.xlen(stream)
        fleet.stream_len = dict(zip(streams, pipe.execute(), strict=True))
        fleet.queued_on_streams = sum(fleet.stream_len.values())
        self.fleet = fleet
        return fleet

    def _from_heartbeats(self) -> Fleet:
        ids = self.client.zrangebyscore(self.keys.workers, time.time() - LIVE_SECONDS, "+inf")
        beats = self.client.mget([self.keys.heartbeat(w) for w in ids]) if ids else []
        fleet = Fleet()
        for beat in parsed_heartbeats(beats):
            fleet.heartbeats.append(beat)
            if beat.get("healthy", True) and not beat.get("draining"):
                fleet.workers[beat["worker_id"]] = beat
                slots = int(beat.get("slots") or 0)
                fleet.slots += slots
                model = beat_model(beat)
                fleet.model_slots[model] = fleet.model_slots.get(model, 0) + slots
        self.models_seen.update(fleet.model_slots)
        return fleet

    def target(self, model: str, plan: Plan) -> str:
        """The model a request asking for `model` runs on ("" asks for the default)."""
        return model_choose(model, plan=plan, live=self.fleet.model_slots,
                            configured=getattr(settings, "SLUICE_DEFAULT_MODEL", ""))  # fmt: skip

    def learn(self, answer: Answer) -> None:
        """Which worker holds this conversation's prefix now, and how long answers take."""
        if answer.worker_id and answer.conversation_id:
            self.affinity[answer.conversation_id] = answer.worker_id
            self.affinity.move_to_end(answer.conversation_id)
            if len(self.affinity) > AFFINITY_MAX:
                self.affinity.popitem(last=False)
        duration = answer.usage.duration_ms
        if answer.state == State.DONE and duration:
            self.service_s = 0.8 * self.service_s + 0.2 * duration / 1000

    def route(self, request: QueuedRequest, fleet: Fleet, model: str) -> str:
        """The affinity stream of the worker that served this conversation last, when it is
        live, serves `model` and has a slot for it; else `model`'s shared stream."""
        worker_id = self.affinity.get(request.conversation_id)
        beat = fleet.workers.get(worker_id) if worker_id else None
        if beat is not None and beat_model(beat) == model:
            stream = self.keys.work_for(worker_id)
            if fleet.stream_len.get(stream, 0) + int(beat.get("busy") or 0) < int(beat["slots"]):
                return stream
        return self.keys.work_for_model(model)


def beat_model(beat: dict) -> str:
    """The model a heartbeat's worker serves ("": it announces none)."""
    return str(beat.get("model") or "")


def parsed_heartbeats(raws: list[str | None]) -> list[dict]:
    """The heartbeats that can be read (a worker writes them; one garbled never stops us)."""
    beats = []
    for raw in raws:
        if not raw:
            continue
        try:
            beat = json.loads(raw)
            if isinstance(beat, dict) and beat.get("worker_id"):
                int(beat.get("slots") or 0)
                beats.append(beat)
        except (ValueError, TypeError):
            log.warning("ignoring an unreadable heartbeat: %.200s", raw)
    return beats


class Release:
    def __init__(self, *, client: redis.Redis, keys: Keys, line: Line, running: Running,
                 plans: PlanBook, fleet: FleetView, now_ms: Callable[[], int],
                 prefetch: int) -> None:  # fmt: skip
        self.client = client
        self.keys = keys
        self.line = line
        self.running = running
        self.plans = plans
        self.fleet = fleet
        self.now_ms = now_ms
        self.prefetch = prefetch

    def run(self) -> int:
        """Hands out as many requests as there are free slots; returns how many."""
        line = self.line
        if not len(line.fair):
            return 0
        fleet = self.fleet.refresh()
        room = {model: slots + self.prefetch - fleet.queued(self.keys, model)
                for model, slots in fleet.model_slots.items()}  # fmt: skip
        if not any(free > 0 for free in room.values()):
            return 0
        targets: dict[Flow, str] = {}  # (user, model asked for) → the model it runs on

        def may_run(flow: Flow) -> bool:
            user_id, model = flow
            plan = self.plans.for_user(user_id)
            if self.running.count(user_id) >= plan.max_concurrent:
                return False
            if flow not in targets:
                targets[flow] = self.fleet.target(model, plan)
            return room.get(targets[flow], 0) > 0

        released: list[QueuedRequest] = []
        pipe = self.client.pipeline(transaction=True)
        now = self.now_ms()
        while True:
            request = line.next_to_run(may_run)
            if request is None:
                break
            model = targets[(request.user_id, request.model)]
            if model != request.model:  # the default, decided now: the worker reads it
                request.fields["model"] = model
            stream = self.fleet.route(request, fleet, model)
            fleet.stream_len[stream] = fleet.stream_len.get(stream, 0) + 1
            room[model] -= 1
            transitions.dispatched(pipe, self.keys, request.id, stream=stream,
                                   fields=request.fields)  # fmt: skip
            self.running.add(pipe, request.id, request.user_id, now_ms=now)
            released.append(request)
        if released:
            self.running.keep(pipe)
            line.leave(pipe, released)
            pipe.execute()
        return len(released)
