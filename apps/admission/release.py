"""Release: waiting requests go to workers only as fast as the workers free slots, in fair order,
within each user's max_concurrent, routed by `routing.py` (to the worker whose KV cache likely
holds the prompt, remembered in Redis by `affinity.py`, else to the shared stream).

Per model: each model has its own shared work stream, read by the workers that serve it, and its
own room (its workers' slots less the work waiting on its streams). A request that names no
model runs on the default one (`plans.model_choose`), decided as it leaves the line.

The fleet view is what the workers' heartbeats say (live workers and their slots) plus how much
work waits on the work streams; the answers teach it which worker served each conversation last
and how long an answer takes (the ETAs in positions). A worker whose circuit breaker is open
(worker/breaker.py) is out of routing; half-open, it counts one slot, for its probe.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis
from django.conf import settings

from apps.admission.affinity import AffinityStore
from apps.admission.kinds import is_background
from apps.admission.line import Flow, Line, QueuedRequest
from apps.admission.models import Plan
from apps.admission.plans import PlanBook, model_choose
from apps.admission.routing import AFFINITY, Router
from apps.admission.running import Running
from contract import protocol, transitions
from contract.protocol import Answer, Keys, State

log = logging.getLogger("sluice.dispatcher")

LIVE_SECONDS = 15  # a worker whose last beat is older is not counted
# The most requests whose routing entries a pass reads with the fleet (the rest are read as
# they are routed): the newest arrivals, which on a fleet with free slots leave at once.
READ_AHEAD_MOST = 256


@dataclass
class Fleet:
    """Live workers as their heartbeats describe them, and the work streams' lengths."""

    slots: int = 0
    queued_on_streams: int = 0
    workers: dict[str, dict] = field(default_factory=dict)  # healthy and not draining
    stream_len: dict[str, int] = field(default_factory=dict)
    heartbeats: list[dict] = field(default_factory=list)  # every fresh one
    model_slots: dict[str, int] = field(default_factory=dict)  # model → its workers' slots
    waiting: dict[str, int] = field(default_factory=dict)  # worker → unread on its stream
    # worker → answers it runs now: what it has read and not yet acknowledged, on its own
    # stream and the shared ones (fresh each pass; a heartbeat may be two seconds old)
    running: dict[str, int] = field(default_factory=dict)
    breakers_open: list[str] = field(default_factory=list)  # out of routing (or probing)

    def queued(self, keys: Keys, model: str) -> int:
        """Work waiting or running on `model`'s streams: its shared one and its workers'."""
        return self.stream_len.get(keys.work_for_model(model), 0) + sum(
            self.stream_len.get(keys.work_for(w), 0)
            for w, beat in self.workers.items()
            if beat_model(beat) == model
        )

    def overbooked(self, model: str) -> int:
        """Work waiting for a worker that is already full (routed there for its cache): it
        holds none of the other workers' slots, so it is left out of the model's room."""
        return sum(
            max(0, self.busy(w) + self.waiting.get(w, 0) - int(beat.get("slots") or 0))
            for w, beat in self.workers.items()
            if beat_model(beat) == model
        )

    def busy(self, worker_id: str) -> int:
        """Answers the worker runs: the more of its heartbeat's count and the streams' pending
        entries. A stale beat that missed new work would have routing queue a request behind
        a full worker while others have free slots, which costs seconds of time to first
        token to save a prefill of a fraction of one (bench/fleet.py)."""
        beat = self.workers.get(worker_id) or {}
        return max(int(beat.get("busy") or 0), self.running.get(worker_id, 0))

    def slots_for(self, model: str) -> int:
        return self.model_slots.get(model, 0)


class FleetView:
    def __init__(self, client: redis.Redis, keys: Keys, *, interval: float, clock=time) -> None:
        """`clock`: what tells the time (`monotonic()`, `time()`): the time module, or a
        simulation's clock (bench/fleet_model.py drives this class in simulated time)."""
        self.client = client
        self.clock = clock
        self.keys = keys
        self.interval = interval
        self.fleet = Fleet()
        self.affinity = AffinityStore(
            client, keys, ttl_seconds=getattr(settings, "SLUICE_AFFINITY_TTL_SECONDS", 1800)
        )
        self.router = Router(
            keys,
            self.affinity,
            policy=getattr(settings, "SLUICE_ROUTING", "affinity"),
            max_load=getattr(settings, "SLUICE_AFFINITY_MAX_LOAD", 1.0),
        )
        self.service_s = 10.0  # average time an answer takes
        self.models_seen: set[str] = set()  # every model a live worker has served
        self._read_at = 0.0
        self._ids: list[str] = []  # the live workers' ids at the last reread
        self._ready: Fleet | None = None  # read by `read_with` for this pass's `refresh`

    def refresh(self, candidates: Sequence[QueuedRequest] = ()) -> Fleet:
        """The live workers and how much work waits on their streams, with the affinity
        entries of `candidates` (the requests this pass may route first), in one round trip;
        none when this pass read them already (`read_with`). Heartbeats change every few
        seconds, so they are reread at most every `interval` (and at once while no worker is
        known); the streams' lengths are read on every call. The lengths read are those of
        the streams of the workers known so far: when the live workers, or what they serve,
        have changed, the lengths take a second round trip."""
        ready, self._ready = self._ready, None
        if ready is not None:
            return ready
        pipe = self.client.pipeline(transaction=False)
        finish = self._queue(pipe, candidates)
        return finish(pipe.execute(raise_on_error=False))

    def read_with(self, pipe, candidates: Sequence[QueuedRequest]) -> Callable[[list], None]:
        """`refresh`'s round trip queued on another pipeline of this pass (the bucket
        script's), so that the pass's `refresh` reads nothing. Returns what takes that
        pipeline's replies from these commands on; if making the fleet of them fails,
        `refresh` reads it again."""
        finish = self._queue(pipe, candidates)

        def received(replies: list) -> None:
            try:
                self._ready = finish(replies)
            except Exception as exc:  # the pass's refresh reads it again
                log.warning("fleet read with the buckets failed (%s): read again", exc)

        return received

    def drop_read(self) -> None:
        """Forgets a `read_with` this pass did not use: the next pass reads afresh."""
        self._ready = None

    def _queue(self, pipe, candidates: Sequence[QueuedRequest]) -> Callable[[list], Fleet]:
        fleet = self.fleet
        now = self.clock.monotonic()
        reread = now >= self._read_at or not fleet.workers
        known = self._ids if reread else []  # their heartbeats are read in the same trip
        start = len(pipe)
        written = self.affinity.flush(pipe)  # what the last answers taught
        flushed = len(pipe) - start
        if reread:
            self._read_at = now + self.interval
            pipe.zrangebyscore(self.keys.workers, self.clock.time() - LIVE_SECONDS, "+inf")
            if known:
                pipe.mget([self.keys.heartbeat(w) for w in known])
        reads = len(pipe) - start - flushed
        streams = self._queue_lengths(pipe, fleet)
        lengths_end = len(pipe) - start - flushed
        routing = candidates if self.router.policy == AFFINITY else ()
        received = self.affinity.read_ahead(pipe, routing)

        def finish(replies: list) -> Fleet:
            written(replies)
            replies = replies[flushed:]  # from here on, counted from the first read
            received(replies[lengths_end:])
            fleet = self.fleet
            if reread:
                for reply in replies[:reads]:
                    if isinstance(reply, Exception):
                        raise reply
                ids, beats = replies[0], (replies[1] if known else [])
                if ids != known:  # a worker came or went: its heartbeat is not among `beats`
                    beats = self.client.mget([self.keys.heartbeat(w) for w in ids]) if ids else []
                fleet = self._from_heartbeats(beats)
                self._ids = ids
            lengths, names = replies[reads:lengths_end], streams
            if self._streams(fleet) != names:  # the reread changed them: read their lengths
                again = self.client.pipeline(transaction=False)
                names = self._queue_lengths(again, fleet)
                lengths = again.execute(raise_on_error=False)
            self._lengths(fleet, names, lengths)
            self.fleet = fleet
            return fleet

        return finish

    def _streams(self, fleet: Fleet) -> list[str]:
        return [
            *(self.keys.work_for_model(m) for m in fleet.model_slots),
            *(self.keys.work_for(w) for w in fleet.workers),
        ]

    def _queue_lengths(self, pipe, fleet: Fleet) -> list[str]:
        """Queues the reads of `fleet`'s streams' lengths; returns the streams."""
        streams = self._streams(fleet)
        for stream in streams:
            pipe.xlen(stream)
        for worker_id in fleet.workers:  # what its worker has read: running, not waiting
            pipe.xpending(self.keys.work_for(worker_id), protocol.WORKER_GROUP)
        for model in fleet.model_slots:  # what each worker took from the shared streams
            pipe.xpending(self.keys.work_for_model(model), protocol.WORKER_GROUP)
        return streams

    def _lengths(self, fleet: Fleet, streams: list[str], replies: list) -> None:
        lengths = [r if isinstance(r, int) else 0 for r in replies[: len(streams)]]
        fleet.stream_len = dict(zip(streams, lengths, strict=True))
        fleet.queued_on_streams = sum(fleet.stream_len.values())
        pending_replies = replies[len(streams) : len(streams) + len(fleet.workers)]
        for worker_id, pending in zip(fleet.workers, pending_replies, strict=True):
            read = pending.get("pending", 0) if isinstance(pending, dict) else 0
            fleet.waiting[worker_id] = max(
                0, fleet.stream_len[self.keys.work_for(worker_id)] - read
            )
            fleet.running[worker_id] = read
        shared = replies[len(streams) + len(fleet.workers) :]
        for pending in shared[: len(fleet.model_slots)]:
            consumers = pending.get("consumers") if isinstance(pending, dict) else None
            for consumer in consumers or ():
                name = consumer.get("name")
                if name in fleet.running:
                    fleet.running[name] += int(consumer.get("pending") or 0)

    def _from_heartbeats(self, beats: list[str | None]) -> Fleet:
        fleet = Fleet()
        for beat in parsed_heartbeats(beats):
            fleet.heartbeats.append(beat)
            if beat.get("healthy", True) and not beat.get("draining"):
                model = beat_model(beat)
                slots = int(beat.get("slots") or 0)
                breaker = breaker_state(beat)
                if breaker != "closed":  # out of routing; half-open, room for its one probe
                    fleet.breakers_open.append(beat["worker_id"])
                    slots = int(breaker == "half_open")
                else:
                    fleet.workers[beat["worker_id"]] = beat
                fleet.slots += slots
                fleet.model_slots[model] = fleet.model_slots.get(model, 0) + slots
        self.models_seen.update(fleet.model_slots)
        return fleet

    def target(self, model: str, plan: Plan) -> str:
        """The model a request asking for `model` runs on ("" asks for the default)."""
        return model_choose(
            model,
            plan=plan,
            live=self.fleet.model_slots,
            configured=getattr(settings, "SLUICE_DEFAULT_MODEL", ""),
        )

    def learn(self, answer: Answer) -> None:
        """Which worker holds this conversation's prefix now, and how long answers take."""
        self.affinity.learn(answer)
        duration = answer.usage.duration_ms
        if answer.state == State.DONE and duration:
            self.service_s = 0.8 * self.service_s + 0.2 * duration / 1000

    def route(self, requests: list[tuple[QueuedRequest, str]], fleet: Fleet) -> list[str]:
        """The work stream of each (request, model it runs on), by the routing policy."""
        workers = {w: {**beat, "busy": fleet.busy(w)} for w, beat in fleet.workers.items()}
        return self.router.route(requests, workers, fleet.waiting)


def beat_model(beat: dict) -> str:
    """The model a heartbeat's worker serves ("": it announces none)."""
    return str(beat.get("model") or "")


def breaker_state(beat: dict) -> str:
    """closed, open or half_open: what the worker's circuit breaker says (closed: none)."""
    breaker = beat.get("breaker")
    return str(breaker.get("state") or "closed") if isinstance(breaker, dict) else "closed"


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
    def __init__(
        self,
        *,
        client: redis.Redis,
        keys: Keys,
        line: Line,
        running: Running,
        plans: PlanBook,
        fleet: FleetView,
        now_ms: Callable[[], int],
        prefetch: int,
    ) -> None:
        self.client = client
        self.keys = keys
        self.line = line
        self.running = running
        self.plans = plans
        self.fleet = fleet
        self.now_ms = now_ms
        self.prefetch = prefetch
        self.longest_wait_ms = 0  # of the people's requests released since it was last taken

    def take_longest_wait_ms(self) -> int:
        longest, self.longest_wait_ms = self.longest_wait_ms, 0
        return longest

    def read_ahead(self, pipe, requests: Sequence[QueuedRequest]) -> Callable[[list], None]:
        """The fleet's read for this pass's `run`, queued on the caller's `pipe` with the
        routing entries of `requests` (see FleetView.read_with)."""
        return self.fleet.read_with(pipe, requests)

    def run(self, pipe=None, *, background: bool = True) -> int:
        """Hands out as many requests as there are free slots; returns how many. `pipe`: a
        MULTI pipeline of the caller's to queue the writes on (the caller executes it).
        `background` False: background work stays in line (the service degrades)."""
        line = self.line
        arrived = line.take_arrived(READ_AHEAD_MOST)
        if not len(line.fair):
            self.fleet.drop_read()
            self.fleet.affinity.flush()  # what the last answers taught, for a standby too
            return 0
        fleet = self.fleet.refresh(arrived)  # writes what they taught in the same round trip
        if self.fleet.router.pushes:  # a load balancer forwards at once: workers queue it
            room = {model: len(line.fair) for model, slots in fleet.model_slots.items() if slots}
        else:
            room = {
                model: slots
                + self.prefetch
                - fleet.queued(self.keys, model)
                + fleet.overbooked(model)
                for model, slots in fleet.model_slots.items()
            }
        if not any(free > 0 for free in room.values()):
            return 0
        targets: dict[Flow, str] = {}  # (user, model asked for) → the model it runs on

        def has_room(flow: Flow, plan: Plan) -> bool:
            if flow not in targets:
                targets[flow] = self.fleet.target(flow[1], plan)
            return room.get(targets[flow], 0) > 0

        def may_run(flow: Flow) -> bool:
            plan = self.plans.for_user(flow[0])
            return self.running.count(flow[0]) < plan.max_concurrent and has_room(flow, plan)

        def background_may_run(flow: Flow) -> bool:
            # An allowance of its own: a summary never takes one of its user's places.
            plan = self.plans.for_user(flow[0])
            allowed = plan.max_background_concurrent
            return self.running.count_background(flow[0]) < allowed and has_room(flow, plan)

        picked: list[tuple[QueuedRequest, str]] = []
        own = pipe is None
        if own:
            pipe = self.client.pipeline(transaction=True)
        now = self.now_ms()
        while True:
            request = line.next_to_run(
                may_run, background=background, background_may_run=background_may_run
            )
            if request is None:
                break
            if not is_background(request.kind):
                self.longest_wait_ms = max(self.longest_wait_ms, now - request.submitted_ms)
            model = targets[(request.user_id, request.model)]
            if model != request.model:  # the default, decided now: the worker reads it
                request.fields["model"] = model
            room[model] -= 1
            self.running.add(pipe, request, model=model, now_ms=now)  # the user's limits, ETAs
            picked.append((request, model))
        if not picked:
            return 0
        # Routed together: one read of the affinity entries for everything this pass releases.
        released = [request for request, _ in picked]
        for request, stream in zip(released, self.fleet.route(picked, fleet), strict=True):
            fleet.stream_len[stream] = fleet.stream_len.get(stream, 0) + 1
            transitions.dispatched(
                pipe, self.keys, request.id, stream=stream, fields=request.fields
            )
        if released:
            self.running.keep(pipe)
            line.leave(pipe, released)
            if own:
                pipe.execute()
        return len(released)
