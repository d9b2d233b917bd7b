"""The sweep: waiting requests whose user pressed stop, or whose max queue wait ran out, and
background work still waiting when the service starts to degrade (people come first).

It touches the stops noted in the `cancels` set, a bounded slice of cancel flags and the
deadlines that are due, never the whole line (watch.py). A request that runs out of time says
why: waiting for a worker (charged, no slot came free) or held by its plan's rate (never
charged): the user reads the real reason, and the metrics count it.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from apps.admission import outcomes
from apps.admission.degradation import Degradation
from apps.admission.fairqueue import BACKGROUND
from apps.admission.kinds import is_background
from apps.admission.line import Line
from apps.admission.metrics import MetricsBatch
from apps.admission.unserved import Endings
from worker.protocol import Keys, State

NO_WORKER_RETRY_AFTER = 60  # seconds: a busy service needs a while to drain


class Sweep:
    def __init__(
        self,
        *,
        client: redis.Redis,
        keys: Keys,
        line: Line,
        now_ms: Callable[[], int],
        cancel_checks: int,
    ) -> None:
        self.client = client
        self.keys = keys
        self.line = line
        self.now_ms = now_ms
        self.cancel_checks = cancel_checks

    def run(self, *, level: Degradation | None = None) -> int:
        """Ends what is due; returns how many requests it ended."""
        line = self.line
        noted = self.client.smembers(self.keys.cancels)
        stopped = {i for i in noted if i in line} | self._flagged()
        now = self.now_ms()
        late = [i for i in line.deadlines.due(now, line.requests) if i not in stopped]
        deferred = []
        if level is not None and level.level >= 1:
            deferred = [i for i in self._background() if i not in stopped and i not in late]
        if not stopped and not late and not noted and not deferred:
            return 0
        pipe = self.client.pipeline(transaction=True)
        endings = Endings(self.keys)
        metrics = MetricsBatch()
        for request_id in stopped:
            endings.add(pipe, line.requests[request_id].ended(State.CANCELLED))
        metrics.count("cancelled", len(stopped))
        for request_id in late:
            request = line.requests[request_id]
            if request.charged:
                error = outcomes.timed_out(waited_s=(now - request.submitted_ms) / 1000)
                retry_after, reason, code = NO_WORKER_RETRY_AFTER, "no_worker", "no_worker"
            else:
                wait_s = max(1.0, (request.retry_at_ms - now) / 1000)
                error = outcomes.rate_limited(bucket=request.held_by, wait_s=wait_s)
                retry_after, reason, code = int(wait_s) + 1, "rate", "rate_limited"
            endings.add(pipe, request.ended(State.FAILED, error, retry_after, code=code))
            metrics.count("timed_out", reason=reason)
        for request_id in deferred:
            error = outcomes.background_deferred(retry_after=level.retry_after)
            request = line.requests[request_id]
            endings.add(pipe, request.ended(State.FAILED, error, level.retry_after, code="shed"))
            metrics.count("rejected", reason="background")
        ended = [line.requests[i] for i in (*stopped, *late, *deferred)]
        line.leave(pipe, ended)  # a charged request's charge goes back with its answer record
        if noted:
            pipe.srem(self.keys.cancels, *noted)
        metrics.write(pipe, self.keys.metrics)
        replies = pipe.execute()
        if endings:
            endings.record(self.client, replies)
        for request in ended:
            line.forget(request.id)
        return len(ended)

    def _background(self) -> list[str]:
        """Background requests waiting: charged ones in their tier, and any a rate holds."""
        held = [
            i
            for ids in self.line.held.values()
            for i in ids
            if is_background(self.line.requests[i].kind)
        ]
        return self.line.fair.tier_ids(BACKGROUND) + held

    def _flagged(self) -> set[str]:
        """Waiting requests with a cancel flag, among this sweep's slice of the line."""
        ids = self.line.cancel_watch.next_slice(self.cancel_checks, self.line.requests)
        # MGET in chunks: one command per 500 requests costs far less than one EXISTS each.
        # (On a Redis Cluster the cancel keys of different requests live in different slots:
        # there this needs one MGET per slot.)
        flags = []
        for i in range(0, len(ids), 500):
            flags.extend(self.client.mget([self.keys.cancel(r) for r in ids[i : i + 500]]))
        return {i for i, flag in zip(ids, flags, strict=True) if flag}
