"""Positions: "You are #3 in line (about 12 s)", pushed to waiting requests, within a bound.

The ETA is worked out from what is left to do on the request's model: the answers its workers
run now, each with its predicted length (estimates.py) less what it has decoded since it was
handed out, and each request ahead with its own predicted length, at the speed one answer
decodes on that model, plus the rest of the time an answer holds a slot (to its first token,
and the hand-out and hand-back around it; servicetimes.py, both measured from the answers).
Each slot frees when its answer ends; the request ahead takes the first slot free, and so on
down the line: the request's ETA is when a slot frees for it. Before, the ETA was the place
over the slots times a moving average of the answers' service time, which ignores how much of
the running answers is left: behind two long answers just started, after a run of short ones,
it said "about 1 s" for a wait of several. Until a model's speed is measured, that old rule is
all there is, and it is used.

Every release moves everyone behind it, so "push each changed position" would mean a push per
waiting request per pass. Instead the head of the line (the requests about to run, whose users
watch most closely) hears every change; every request hears its first position soon after it
is queued; and the rest hear again once their last news is a few seconds old, the stalest
first, so a deep request is not starved by those nearer the head.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable

import redis

from apps.admission import outcomes
from apps.admission.line import Line, QueuedRequest
from apps.admission.metrics import MetricsBatch
from apps.admission.plans import PlanBook
from apps.admission.release import FleetView
from apps.admission.running import Answering, Running
from apps.admission.servicetimes import ServiceTimes
from contract import transitions
from contract.protocol import Keys

HEAD = 20  # places told at every change
RETELL_MS = 5000  # further back: at most this often
# The head hears its ETA again, place unchanged, once it has drifted this far from the last
# told (a running answer that goes on longer than predicted, or ends early).
DRIFT_S, DRIFT_SHARE = 2.0, 0.2
# A running answer already longer than its prediction: it is taken to go on for this share of
# the prediction more, within its max_tokens (it could stop at any moment, or run to the cap).
OVERRUN = 0.25


class Positions:
    """Pushes the positions that changed: the head of the line at every pass; the rest when
    the whole order is recomputed, which takes at most `share` of the dispatcher's time (every
    pass for a short line, every few seconds for tens of thousands)."""

    def __init__(
        self,
        *,
        client: redis.Redis,
        keys: Keys,
        line: Line,
        fleet: FleetView,
        now_ms: Callable[[], int],
        pushes: int,
        share: float,
        service: ServiceTimes | None = None,
        plans: PlanBook | None = None,
        running: Running | None = None,
    ) -> None:
        self.client = client
        self.running = running if running is not None else Running(keys)  # empty is falsy
        self.service = service or ServiceTimes(keys)
        self.plans = plans or PlanBook()
        self.keys = keys
        self.line = line
        self.fleet = fleet
        self.now_ms = now_ms
        self.pushes = pushes
        self.share = share
        self._whole_due = 0.0

    def tell(self) -> int:
        """Returns how many positions it pushed."""
        if not len(self.line):
            return 0
        now = self.now_ms()
        started = time.monotonic()
        whole = started >= self._whole_due
        order = self.line.order() if whole else self.line.head(HEAD)
        steady: list[tuple[int, str]] = []
        chosen = positions_to_tell(
            order, self.line.requests, now_ms=now, limit=self.pushes, steady=steady
        )
        etas = self.etas(order, [rid for _, rid in chosen + steady], now_ms=now)
        chosen += [(p, rid) for p, rid in steady if _drifted(self.line.requests[rid], etas[rid])]
        told = self._push(chosen, etas, now)
        if whole:
            # Spent s of every s / share: at share 1 the next pass recomputes it again.
            self._whole_due = started + (time.monotonic() - started) / self.share
        return told

    def etas(self, order: list[str], wanted: list[str], *, now_ms: int) -> dict[str, float]:
        """Seconds until each of `wanted` starts, walking `order` (the line in release order)
        as far as the last of them."""
        left = set(wanted)
        etas: dict[str, float] = {}
        lines: dict[str, _ModelLine] = {}  # per model asked for, as places are counted
        for request_id in order:
            if not left:
                break
            request = self.line.requests[request_id]
            line = lines.get(request.model)
            if line is None:
                line = lines[request.model] = self._model_line(request, now_ms)
            start = line.take(request)
            if request_id in left:
                left.discard(request_id)
                etas[request_id] = start
        return etas

    def _model_line(self, request: QueuedRequest, now_ms: int) -> _ModelLine:
        fleet = self.fleet.fleet
        # Its model's workers serve its line; one that names none runs on the default model,
        # decided as it leaves the line (the same choice, made here for the ETA).
        model = request.model or self.fleet.target("", self.plans.for_user(request.user_id))
        slots = max(1, fleet.slots_for(model) or fleet.slots)
        speed = self.service.speed_of(model)
        if speed is None:
            return _ModelLine(slots, per_place=self.service.eta(model, place=1, slots=slots))
        line = _ModelLine(slots, speed=speed[0], first_s=speed[1])
        line.running(self.running.of_model(model), now_ms)
        return line

    def _push(self, chosen: list[tuple[int, str]], etas: dict[str, float], now: int) -> int:
        if not chosen:
            return 0
        pipe = self.client.pipeline(transaction=False)
        first_told = 0
        for place, request_id in chosen:
            request = self.line.requests[request_id]
            eta = etas[request_id]
            reason = ""
            if not request.charged:  # its plan's rate holds it: say so, and until when
                held_s = (request.retry_at_ms - now) / 1000
                eta = max(eta, held_s)
                reason = outcomes.waiting_reason(bucket=request.held_by, wait_s=held_s)
            if not request.told_position:
                first_told += 1
            request.told_position, request.told_at_ms = place, now
            request.told_eta_s = max(1, round(eta))
            transitions.position(
                pipe,
                self.keys,
                request_id,
                place=place,
                eta_seconds=request.told_eta_s,
                reason=reason,
            )
        if first_told:
            MetricsBatch(counts={"queued": first_told}).write(pipe, self.keys.metrics)
        pipe.execute()
        return len(chosen)


def positions_to_tell(
    order: Iterable[str],
    requests: dict[str, QueuedRequest],
    *,
    now_ms: int,
    limit: int,
    steady: list[tuple[int, str]] | None = None,
) -> list[tuple[int, str]]:
    """(position, id) pairs to push, at most `limit`: the head's changes, then first positions
    in line order, then the stalest of the rest. `order` is the whole waiting line, or its head
    alone (then only the head hears). A position counts the requests ahead for the same model:
    each model's workers serve their own line. `steady` receives the head's places that have
    not changed (their ETAs may have)."""
    head: list[tuple[int, str]] = []
    first: list[tuple[int, str]] = []
    stale: list[tuple[int, int, str]] = []
    places: dict[str, int] = {}
    for request_id in order:
        request = requests[request_id]
        position = places[request.model] = places.get(request.model, 0) + 1
        told = request.told_position
        if told == position:
            if steady is not None and position <= HEAD:
                steady.append((position, request_id))
            continue
        if position <= HEAD:
            head.append((position, request_id))
        elif not told:
            if len(first) < limit:
                first.append((position, request_id))
        elif now_ms - request.told_at_ms >= RETELL_MS:
            stale.append((request.told_at_ms, position, request_id))
    chosen = (head + first)[:limit]
    room = limit - len(chosen)
    if room > 0 and stale:
        chosen += [(position, rid) for _, position, rid in heapq.nsmallest(room, stale)]
    return chosen


def _drifted(request: QueuedRequest, eta: float) -> bool:
    told = request.told_eta_s
    return abs(max(1, round(eta)) - told) >= max(DRIFT_S, DRIFT_SHARE * told)


class _ModelLine:
    """One model's slots as the ETA walks its line: when each frees (a heap of seconds from
    now). Without a measured speed, the old rule: place over slots times the service time."""

    def __init__(
        self, slots: int, *, speed: float = 0.0, first_s: float = 0.0, per_place: float = 0.0
    ) -> None:
        self.speed, self.first_s, self.per_place = speed, first_s, per_place
        self.free = [0.0] * slots
        self.slots = slots
        self.places = 0

    def running(self, answers: list[Answering], now_ms: int) -> None:
        """The answers its workers run now, each ending when what is left of it is decoded;
        those beyond the slots (handed out, not started) wait for a slot as the line does."""
        left = sorted(self._left(a, now_ms) for a in answers)
        for seconds in left:
            heapq.heappush(self.free, heapq.heappop(self.free) + seconds)

    def take(self, request: QueuedRequest) -> float:
        """When `request`, next in this line, starts; its slot is then busy for as long as
        its predicted answer takes."""
        self.places += 1
        if not self.speed:
            return self.places * self.per_place
        tokens = request.estimate or request.max_tokens
        return self._start(tokens)

    def _start(self, tokens: int) -> float:
        start = heapq.heappop(self.free)
        heapq.heappush(self.free, start + self.first_s + tokens / self.speed)
        return start

    def _left(self, answer: Answering, now_ms: int) -> float:
        elapsed = max(0.0, (now_ms - answer.since_ms) / 1000)
        decoded = max(0.0, elapsed - self.first_s) * self.speed
        tokens = answer.tokens - decoded
        if tokens <= 0:
            tokens = max(0.0, min(answer.max_tokens - decoded, OVERRUN * answer.tokens))
        return max(0.0, self.first_s - elapsed) + tokens / self.speed
