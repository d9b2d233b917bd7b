"""Positions: "You are #3 in line (about 12 s)", pushed to waiting requests, within a bound.

The ETA is the place over the live slots of the request's model, times that model's measured
service time (servicetimes.py: start to final, a moving average per model).

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
from apps.admission.servicetimes import ServiceTimes
from worker import transitions
from worker.protocol import Keys

HEAD = 20  # places told at every change
RETELL_MS = 5000  # further back: at most this often


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
    ) -> None:
        self.client = client
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
        chosen = positions_to_tell(order, self.line.requests, now_ms=now, limit=self.pushes)
        told = self._push(chosen, now)
        if whole:
            # Spent s of every s / share: at share 1 the next pass recomputes it again.
            self._whole_due = started + (time.monotonic() - started) / self.share
        return told

    def _push(self, chosen: list[tuple[int, str]], now: int) -> int:
        if not chosen:
            return 0
        fleet = self.fleet.fleet
        pipe = self.client.pipeline(transaction=False)
        first_told = 0
        for place, request_id in chosen:
            request = self.line.requests[request_id]
            # Its model's workers serve its line; one that names none runs on the default
            # model, decided as it leaves the line (the same choice, made here for the ETA).
            model = request.model or self.fleet.target("", self.plans.for_user(request.user_id))
            slots = fleet.slots_for(model) or fleet.slots
            eta = self.service.eta(model, place=place, slots=slots)
            reason = ""
            if not request.charged:  # its plan's rate holds it: say so, and until when
                held_s = (request.retry_at_ms - now) / 1000
                eta = max(eta, held_s)
                reason = outcomes.waiting_reason(bucket=request.held_by, wait_s=held_s)
            if not request.told_position:
                first_told += 1
            request.told_position, request.told_at_ms = place, now
            transitions.position(
                pipe,
                self.keys,
                request_id,
                place=place,
                eta_seconds=max(1, round(eta)),
                reason=reason,
            )
        if first_told:
            MetricsBatch(counts={"queued": first_told}).write(pipe, self.keys.metrics)
        pipe.execute()
        return len(chosen)


def positions_to_tell(
    order: Iterable[str], requests: dict[str, QueuedRequest], *, now_ms: int, limit: int
) -> list[tuple[int, str]]:
    """(position, id) pairs to push, at most `limit`: the head's changes, then first positions
    in line order, then the stalest of the rest. `order` is the whole waiting line, or its head
    alone (then only the head hears). A position counts the requests ahead for the same model:
    each model's workers serve their own line."""
    head: list[tuple[int, str]] = []
    first: list[tuple[int, str]] = []
    stale: list[tuple[int, int, str]] = []
    places: dict[str, int] = {}
    for request_id in order:
        request = requests[request_id]
        position = places[request.model] = places.get(request.model, 0) + 1
        told = request.told_position
        if told == position:
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
