"""Intake: every new admission entry decided at once, and the requests a plan's rate holds
retried when their buckets allow.

A new request is charged and joins the line; or its plan's rate holds it in line (uncharged)
when the wait fits its max queue wait; or it ends at once with its reason: larger than the plan
allows at all, over a rate for longer than it may wait, shed under heavy load. An entry that
cannot be read goes to the dead-letter stream with the reason. An entry Redis ran only after
the web had given up on it (the web answered 503 and took the question back: Redis was frozen)
is withdrawn, uncharged.

This is the hot path. A batch costs three round trips whatever its size: the read, one call of
the bucket script (on a helper thread while this one encodes the queue records, for a large
batch) and one MULTI that writes the line, ends what ends and acknowledges the entries (then one
more for the answer records, when some request ended). That MULTI may be the caller's, shared
with the release that follows (see `decide`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from apps.admission import outcomes
from apps.admission.buckets import NEVER, TAKEN, Bucket, BucketStore, plan_buckets
from apps.admission.degradation import Degradation
from apps.admission.estimates import Estimator, question_of
from apps.admission.kinds import STATELESS, background_deadline_ms, is_background, kind_decide
from apps.admission.line import Line, QueuedRequest
from apps.admission.metrics import MetricsBatch
from apps.admission.plans import PlanBook
from apps.admission.unserved import Endings, fail_unreadable
from contract import protocol, transitions
from contract.protocol import DISPATCHER_GROUP, Keys, State

log = logging.getLogger("sluice.dispatcher")

Entries = list[tuple[str, dict[str, str] | None]]
# Queues reads on a pipeline, given the requests being charged; returns what takes the replies.
ReadAlongside = Callable[[Any, list[QueuedRequest]], Callable[[list], None]]


class Intake:
    def __init__(
        self,
        *,
        client: redis.Redis,
        keys: Keys,
        plans: PlanBook,
        buckets: BucketStore,
        line: Line,
        now_ms: Callable[[], int],
        bucket_now: Callable[[], int | None],
        batch: int,
        estimator: Estimator | None = None,
    ) -> None:
        self.client = client
        self.estimator = estimator or Estimator(keys)
        self.keys = keys
        self.plans = plans
        self.buckets = buckets
        self.line = line
        self.now_ms = now_ms
        self.bucket_now = bucket_now
        self.batch = batch
        self.backlog_first = True
        self.answers_seen: list[str] = []  # see `read`
        self._last_ns = 0
        self._unwritten: tuple[Endings, list[str]] | None = None  # see `written`

    def reset(self) -> None:
        """After a load: what the previous lease holder had read but not decided comes first."""
        self.backlog_first = True
        self._unwritten = None  # its MULTI failed: the entries are read again

    def read(self, *, block_ms: int) -> Entries:
        """New admission entries, waiting up to `block_ms` for one, or for an answer record (an
        answer is stored as soon as it ends: Dispatcher.step). Those
        records are only a wake-up here; the recorder reads them through its own group."""
        if self.backlog_first:
            entries = self._read({self.keys.admit: "0"}, block_ms=None)
            if len(entries) < self.batch:
                self.backlog_first = False
            if entries:
                return entries
        return self._read({self.keys.admit: ">", self.keys.done: ">"}, block_ms=block_ms)

    def _read(self, streams: dict[str, str], *, block_ms: int | None) -> Entries:
        response = self.client.xreadgroup(
            DISPATCHER_GROUP, protocol.ACTIVE_CONSUMER, streams, count=self.batch, block=block_ms
        )
        read = dict(response or [])
        self.answers_seen += [entry_id for entry_id, _ in read.get(self.keys.done, [])]
        return read.get(self.keys.admit, [])

    def answers_seen_ack(self, pipe) -> bool:
        """Queues the acknowledgement of the answer records `read` saw; whether there were any."""
        seen, self.answers_seen = self.answers_seen, []
        if seen:
            pipe.xack(self.keys.done, DISPATCHER_GROUP, *seen)
        return bool(seen)

    # -- new requests ----------------------------------------------------------------------------

    def decide(
        self,
        entries: Entries,
        *,
        level: Degradation,
        pipe=None,
        alongside: ReadAlongside | None = None,
    ) -> int:
        """Decides `entries` (as `read` returns them); returns how many. `alongside(pipe,
        requests)`: queues reads for the bucket script's round trip, given the requests it
        charges (Release.read_ahead: the fleet and their routing). `pipe`: a MULTI
        pipeline of the caller's, which then executes it and hands its replies to `written`;
        the requests are in the line's mirror at once (a failed MULTI has the caller rebuild
        the mirrors from Redis, as every Redis error does)."""
        if not entries:
            return 0
        now = self.now_ms()
        metrics = MetricsBatch()
        queued: list[QueuedRequest] = []
        to_charge: list[tuple[QueuedRequest, list[Bucket]]] = []
        rejected: list[tuple[QueuedRequest, str, int | None, str]] = []  # error, retry, reason
        withdrawn: list[QueuedRequest] = []
        unreadable: list[tuple[str, dict, str]] = []
        buckets_of: dict[tuple, list[Bucket]] = {}  # most of a batch shares a plan and a size
        for entry_id, fields in entries:
            if not fields:  # pending from an earlier read, and deleted from the stream since
                unreadable.append((entry_id, {}, "deleted from the stream before it was decided"))
                continue
            try:
                request, plan, submit_by_ms = self._parse(fields, now, level)
            except (KeyError, ValueError, TypeError) as exc:
                unreadable.append((entry_id, fields or {}, f"{exc.__class__.__name__}: {exc}"))
                continue
            # The entry id's first part is when Redis ran the web's XADD.
            if submit_by_ms and int(entry_id.partition("-")[0]) > submit_by_ms:
                withdrawn.append(request)
                continue
            metrics.latency(now - request.submitted_ms)
            if request.model and not plan.allows(request.model):
                rejected.append(
                    (request, outcomes.model_not_allowed(model=request.model), None, "model")
                )
                continue
            if level.reject_lowest_plan and self.plans.is_lowest(plan):
                rejected.append(
                    (
                        request,
                        outcomes.shed(retry_after=level.retry_after),
                        level.retry_after,
                        "shed",
                    )
                )
                continue
            if request.worst_cost > min(plan.burst_tokens, plan.tokens_per_day):
                # The estimate may fit, but an answer running to its cap would not.
                rejected.append(
                    (
                        request,
                        outcomes.too_large(
                            tokens=request.worst_cost,
                            limit=min(plan.burst_tokens, plan.tokens_per_day),
                        ),
                        None,
                        "too_large",
                    )
                )
                continue
            first_held = self.line.holds(request.user_id)
            if first_held is not None:  # held by its plan's rate: later ones wait behind it
                request.retry_at_ms, request.held_by = first_held.retry_at_ms, first_held.held_by
                queued.append(request)
                continue
            size = (plan.slug, request.cost, request.kind_weight)
            if size not in buckets_of:
                buckets_of[size] = plan_buckets(
                    plan, tokens=request.cost, requests=request.kind_weight
                )
            to_charge.append((request, buckets_of[size]))
        charging = [request for request, _ in to_charge]
        reads = None if alongside is None else lambda pipe: alongside(pipe, charging)
        pending = self.buckets.take_in_background(
            [(self.keys.bucket(r.user_id), b) for r, b in to_charge],
            now_ms=self.bucket_now(),
            alongside=reads,
        )
        # While Redis runs the script, encode the queue records as charged, the usual outcome
        # (most of the Python work of a batch); the others are redone below.
        encoded = {request.id: request.encode() for request in queued}
        for request, _ in to_charge:
            request.charged = True
            encoded[request.id] = request.encode()
        decisions = pending.result()
        admitted = 0
        for (request, buckets), decision in zip(to_charge, decisions, strict=True):
            if decision.code == TAKEN:
                queued.append(request)
                admitted += 1
                continue
            request.charged = False
            if decision.code == NEVER:
                error = outcomes.too_large(
                    tokens=request.cost, limit=_capacity(buckets, decision.bucket)
                )
                rejected.append((request, error, None, "too_large"))
            elif decision.wait_ms < request.deadline_ms - now:
                request.retry_at_ms, request.held_by = now + decision.wait_ms, decision.bucket
                encoded[request.id] = request.encode()
                queued.append(request)
            else:
                wait_s = decision.wait_ms / 1000
                error = outcomes.rate_limited(bucket=decision.bucket, wait_s=wait_s)
                rejected.append((request, error, int(wait_s) + 1, "rate"))
        metrics.count("admitted", admitted)
        own = pipe is None
        if own:
            pipe = self.client.pipeline(transaction=True)
        # A charged request's charge lives in its queue record until it leaves the line.
        self.line.store(pipe, queued, encoded)
        endings = Endings(self.keys)
        for request, error, retry_after, reason in rejected:
            endings.add(
                pipe,
                request.ended(
                    State.FAILED, error, retry_after, code=outcomes.REJECTION_CODES[reason]
                ),
            )
            metrics.count("rejected", reason=reason)
        for request in withdrawn:
            endings.add(pipe, request.ended(State.CANCELLED))
        metrics.count("withdrawn", len(withdrawn))
        for entry_id, fields, reason in unreadable:
            log.error("dead-lettering admission entry %s: %s", entry_id, reason)
            transitions.dead_letter(
                pipe,
                self.keys,
                source="dispatcher",
                reason=reason,
                stream=self.keys.admit,
                entry_id=entry_id,
                fields=fields,
            )
        metrics.count("invalid", len(unreadable))
        entry_ids = [entry_id for entry_id, _ in entries]
        pipe.xack(self.keys.admit, DISPATCHER_GROUP, *entry_ids)
        pipe.xdel(self.keys.admit, *entry_ids)
        metrics.write(pipe, self.keys.metrics)
        for request in queued:
            self.line.add(request)
        self._unwritten = (endings, [str(f["id"]) for _, f, _ in unreadable if f.get("id")])
        if own:
            self.written(pipe.execute())
        return len(entries)

    def written(self, replies: list) -> None:
        """After the MULTI that carried `decide`'s writes: the answer records of the requests
        it ended, and the ends of those whose entry could not be read."""
        if self._unwritten is None:
            return
        (endings, unreadable), self._unwritten = self._unwritten, None
        if endings:
            endings.record(self.client, replies)
        fail_unreadable(self.client, self.keys, unreadable)

    def _parse(self, fields: dict[str, str], now: int, level: Degradation):
        """The request an entry describes, its plan, and the time the web gave up waiting for
        Redis (0: none given). Raises KeyError, ValueError or TypeError for a bad entry."""
        if fields.get("v") not in protocol.READABLE_VERSIONS:
            raise ValueError(f"unsupported work item version {fields.get('v')!r}")
        if "messages" not in fields:
            raise KeyError("messages")
        request_id, user_id = fields["id"], fields["user_id"]
        conversation_id = fields["conversation_id"]
        submitted_kind = fields.get("kind") or "chat"
        if not (request_id and user_id):
            raise ValueError("id and user_id must not be empty")
        if not conversation_id and submitted_kind not in STATELESS:
            # Only the API's and Sluice's own (background) requests belong to no conversation.
            raise ValueError("conversation_id must not be empty")
        plan = self.plans.for_user(user_id)
        asked = int(fields["max_tokens"])
        prompt_tokens = max(0, int(fields.get("prompt_tokens_estimate") or 0))
        kind = kind_decide(
            submitted=submitted_kind,
            prompt_tokens=prompt_tokens,
            long_prompt_tokens=plan.long_prompt_tokens,
        )
        if kind != submitted_kind:
            fields["kind"] = kind
        submitted = int(fields.get("submitted_ms") or now)
        submit_by_ms = int(fields.get("submit_by_ms") or 0)
        cap = plan.max_tokens_cap
        if level.cap_max_tokens:
            cap = min(cap, level.cap_max_tokens)
        max_tokens = max(1, min(asked, cap))
        if max_tokens != asked:
            fields["max_tokens"] = str(max_tokens)
        request = QueuedRequest(
            request_id,
            user_id,
            conversation_id,
            kind,
            plan.slug,
            prompt_tokens,
            max_tokens,
            plan.priority_weight,
            submitted,
            background_deadline_ms(fields, submitted)
            if is_background(kind)
            else submitted + plan.max_queue_wait_seconds * 1000,
            self._next_ns(),
            False,
            0,
            "",
            fields,
        )
        request.kind_weight = plan.cost_weight(kind)
        guess = self.estimator.guess(
            kind=kind,
            user_id=user_id,
            plan=plan.slug,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            question=question_of(fields["messages"]),
        )
        request.estimate, request.features = guess.tokens, guess.x
        return request, plan, submit_by_ms

    def _next_ns(self) -> int:
        # Strictly increasing, so a reload restores the order of requests queued together.
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        return self._last_ns

    # -- requests held by their plan's rate --------------------------------------------------------

    def held_due(self) -> bool:
        """Whether `retry_held` has a request to retry now."""
        now = self.now_ms()
        return any(r.retry_at_ms <= now for r in self.line.first_held())

    def retry_held(self) -> None:
        """The first held request of each user whose wait is over tries its buckets again:
        charged, it joins the fair queue; still held, it waits again; too large for the plan
        (the plan changed), it ends. A held request whose deadline comes first is ended by the
        sweep, with the rate as its reason."""
        now = self.now_ms()
        due = [r for r in self.line.first_held() if r.retry_at_ms <= now]
        if not due:
            return
        batch = []
        for request in due:
            plan = self.plans.for_user(request.user_id)
            batch.append(
                (
                    self.keys.bucket(request.user_id),
                    plan_buckets(plan, tokens=request.cost, requests=request.kind_weight),
                )
            )
        decisions = self.buckets.take(batch, now_ms=self.bucket_now())
        charged, waiting, ended = [], [], []
        pipe = self.client.pipeline(transaction=True)
        endings = Endings(self.keys)
        metrics = MetricsBatch()
        for request, decision, (_, buckets) in zip(due, decisions, batch, strict=True):
            if decision.code == TAKEN:
                request.charged, request.held_by = True, ""
                request.queued_ns = self._next_ns()  # joins the fair queue now, at its back
                charged.append(request)
            elif decision.code == NEVER:
                error = outcomes.too_large(
                    tokens=request.cost, limit=_capacity(buckets, decision.bucket)
                )
                endings.add(pipe, request.ended(State.FAILED, error, code="too_large"))
                metrics.count("rejected", reason="too_large")
                ended.append(request)
            else:
                request.retry_at_ms, request.held_by = now + decision.wait_ms, decision.bucket
                waiting.append(request)
        self.line.store(pipe, charged + waiting)
        self.line.leave(pipe, ended)
        metrics.count("admitted", len(charged))
        metrics.write(pipe, self.keys.metrics)
        replies = pipe.execute()
        if endings:
            endings.record(self.client, replies)
        for request in charged:
            self.line.charged(request)
        for request in ended:
            self.line.forget(request.id)


def _capacity(buckets: list[Bucket], name: str) -> int:
    return next(b.capacity for b in buckets if b.name == name)
