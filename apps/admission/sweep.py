"""The sweep: waiting requests whose user pressed stop, or whose max queue wait ran out.

Background work is never refused for load: it waits in line while the service degrades (the
release holds it back), and when its own wait runs out it is dropped quietly, cancelled with
code "dropped" and no error, since nobody asked for it (its task decides what then).

It touches the stops noted in the `cancels` set, a bounded slice of cancel flags and the
deadlines that are due, never the whole line (watch.py). A request that runs out of time says
why: waiting for a worker (charged, no slot came free) or held by its plan's rate (never
charged): the user reads the real reason, and the metrics count it.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from apps.admission import outcomes
from apps.admission.kinds import is_background
from apps.admission.line import Line
from apps.admission.metrics import MetricsBatch
from apps.admission.unserved import Endings
from contract.protocol import Keys, State

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

    def run(self) -> int:
        """Ends what is due; returns how many requests it ended."""
        line = self.line
        noted = self.client.smembers(self.keys.cancels)
        stopped = {i for i in noted if i in line} | self._flagged()
        now = self.now_ms()
        late = [i for i in line.deadlines.due(now, line.requests) if i not in stopped]
        if not stopped and not late and not noted:
            return 0
        pipe = self.client.pipeline(transaction=True)
        endings = Endings(self.keys)
        metrics = MetricsBatch()
        for request_id in stopped:
            endings.add(pipe, line.requests[request_id].ended(State.CANCELLED))
        metrics.count("cancelled", len(stopped))
        for request_id in late:
            request = line.requests[request_id]
            if is_background(request.kind):
                endings.add(pipe, request.ended(State.CANCELLED, code="dropped"))
                metrics.count("background_dropped")
                continue
            if request.charged:
                # A request its plan's rate held was charged when its token came (retry_at_ms),
                # with what was left of its wait to reach a worker.
                charged_at = request.retry_at_ms or request.submitted_ms
                error = outcomes.timed_out(
                    waited_s=(now - request.submitted_ms) / 1000,
                    held_s=max(0, charged_at - request.submitted_ms) / 1000,
                    left_s=max(0, request.deadline_ms - charged_at) / 1000,
                )
                retry_after, reason, code = NO_WORKER_RETRY_AFTER, "no_worker", "no_worker"
            else:
                wait_s = max(1.0, (request.retry_at_ms - now) / 1000)
                error = outcomes.rate_limited(bucket=request.held_by, wait_s=wait_s)
                retry_after, reason, code = int(wait_s) + 1, "rate", "rate_limited"
            endings.add(pipe, request.ended(State.FAILED, error, retry_after, code=code))
            metrics.count("timed_out", reason=reason)
        ended = [line.requests[i] for i in (*stopped, *late)]
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
