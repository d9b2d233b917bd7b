"""Reconcile: the dispatcher's books brought back in line with what really happened.

Settling answers. Each answer record the recorder reads settles its request: the estimate its
buckets were charged is reconciled with the real usage, times its kind's weight (the difference
refunded, or charged), the user's running count drops, the fleet view learns which worker served
the conversation, the answer-length estimator learns the real length and the service times how
long the answer took. A batch costs three round trips whatever its size.

Lost requests. Every few seconds, each request dispatched more than `grace_ms` ago and still not
settled is checked against the truth, in the request hashes, the workers' heartbeats and the
work streams:

- it has ended, but its answer record never reached the done stream (Redis restarted between
  the final event and the record, or the writer died between them): the record is rebuilt from
  the final event, so the recorder stores the answer, and the request is settled;
- a live worker's heartbeat lists it, or its work item is still on a work stream: it is alive;
- otherwise nothing runs it any more: it fails with a clear message and is settled;
- its hash has expired: it is only forgotten.

A verdict is acted on only when two passes in a row reach it, so a request caught between two
reads (finishing, or moving from one work stream to another) is never taken for lost. The reads
of one verdict run in one MULTI, the request hashes after the evidence of life, which is what
makes "not on a stream and not ended" mean "gone" rather than "finished in between".
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable

import redis

from apps.admission import outcomes
from apps.admission.buckets import BucketStore, plan_buckets
from apps.admission.estimates import Estimator, Sample
from apps.admission.metrics import MetricsBatch
from apps.admission.plans import PlanBook
from apps.admission.release import FleetView, parsed_heartbeats
from apps.admission.running import Running
from apps.admission.servicetimes import ServiceTimes
from apps.admission.timeseries import Samples
from apps.admission.unserved import Endings
from contract import protocol, transitions
from contract.protocol import Answer, EventType, Keys, State

log = logging.getLogger("sluice.dispatcher")

CHECKS = 1000  # requests checked per pass, the longest running first


class Reconcile:
    def __init__(
        self,
        *,
        client: redis.Redis,
        keys: Keys,
        plans: PlanBook,
        buckets: BucketStore,
        running: Running,
        fleet: FleetView,
        now_ms: Callable[[], int],
        bucket_now: Callable[[], int | None],
        grace_ms: int,
        samples: Samples | None = None,
        estimator: Estimator | None = None,
        service: ServiceTimes | None = None,
    ) -> None:
        self.client = client
        self.estimator = estimator or Estimator(keys)
        self.service = service or ServiceTimes(keys)
        self.samples = samples  # the ops page's figures: fed from the answers settled here
        self.keys = keys
        self.plans = plans
        self.buckets = buckets
        self.running = running
        self.fleet = fleet
        self.now_ms = now_ms
        self.bucket_now = bucket_now
        self.grace_ms = grace_ms
        self._verdicts: dict[str, str] = {}  # the previous pass's: request id → ended/lost/gone

    # -- answers ---------------------------------------------------------------------------------

    def settle(self, answers: list[Answer]) -> None:
        """Settles each answer's request (an answer settled before is a no-op)."""
        if not answers:
            return
        ids = [answer.id for answer in answers]
        tokens: Counter[str] = Counter()
        refunds = []
        learned: list[Sample] = []
        for answer, raw in zip(answers, self.client.hmget(self.keys.charges, ids), strict=True):
            self.fleet.learn(answer)
            charge = _charge(raw)
            if charge is None:
                continue
            user_id, plan_slug, estimate, record = charge
            used = _used(answer)
            tokens[plan_slug] += used
            since = self.running.since.get(answer.id)
            held_s = (self.now_ms() - since[1]) / 1000 if since else 0.0
            self.service.learn_answer(str(record.get("model") or ""), answer, held_s=held_s)
            sample = _sample(answer, record, user_id, plan_slug)
            if sample is not None:
                learned.append(sample)
            # Charged at its kind's weight: settled at the same weight.
            difference = estimate - round(used * _float(record.get("w"), 1.0))
            if difference:
                plan = self.plans.for_user(user_id)
                buckets = [
                    b for b in plan_buckets(plan, tokens=difference, requests=0) if b.name != "req"
                ]
                refunds.append((self.keys.bucket(user_id), buckets))
        self.estimator.learn(learned)
        pipe = self.client.pipeline(transaction=False)
        pipe.hdel(self.keys.charges, *ids)
        self.running.settled(pipe, ids)
        self.estimator.save(pipe)
        self.service.save(pipe)
        if tokens:
            MetricsBatch(tokens=dict(tokens)).write(pipe, self.keys.metrics)
        if self.samples is not None:  # when each was submitted and dispatched, same round trip
            self.samples.settle_users(pipe, answers)
            for answer in answers:
                pipe.hmget(self.keys.request(answer.id), "created_ms", "dispatched_ms")
        replies = pipe.execute()
        if self.samples is not None:
            for answer, (created, dispatched) in zip(
                answers, replies[-len(answers) :], strict=True
            ):
                self.samples.settle(
                    answer, created_ms=_int(created) or None, dispatched_ms=_int(dispatched) or None
                )
        self.buckets.adjust(refunds, now_ms=self.bucket_now())

    def save_learning(self, *, force: bool = False) -> None:
        """What the estimator learned and `settle` has not written yet (it writes at most once
        a second): called on every pass, and with `force` when the lease is given up."""
        if force or self.estimator.due():
            pipe = self.client.pipeline(transaction=False)
            self.estimator.save(pipe, force=force)
            if len(pipe):
                pipe.execute()

    # -- lost requests ---------------------------------------------------------------------------

    def find_lost(self) -> int:
        """One pass; returns how many requests it settled."""
        suspects = self.running.dispatched_before(self.now_ms() - self.grace_ms)
        suspects = sorted(suspects, key=lambda rid: self.running.since[rid][1])[:CHECKS]
        if not suspects:
            self._verdicts = {}
            return 0
        workers = self.client.zrange(self.keys.workers, 0, -1)
        pipe = self.client.pipeline(transaction=True)
        if workers:
            pipe.mget([self.keys.heartbeat(w) for w in workers])
        for request_id in suspects:
            pipe.hgetall(self.keys.request(request_id))
        replies = pipe.execute()
        beats = parsed_heartbeats(replies.pop(0)) if workers else []
        on_workers = {
            rid
            for beat in beats
            if isinstance(beat.get("running"), list)
            for rid in beat["running"]
        }
        verdicts: dict[str, str] = {}
        hashes: dict[str, dict] = {}
        unseen = []
        for request_id, fields in zip(suspects, replies, strict=True):
            hashes[request_id] = fields
            if not fields.get("user_id"):  # (an API request has no conversation: "" is fine)
                verdicts[request_id] = "gone"
            elif fields.get("state") in protocol.TERMINAL_STATES:
                verdicts[request_id] = "ended"
            elif request_id not in on_workers:
                unseen.append(request_id)
        if unseen:
            models = self.fleet.models_seen | {str(b.get("model") or "") for b in beats}
            for request_id, fields in self._off_the_streams(unseen, workers, models).items():
                hashes[request_id] = fields
                verdicts[request_id] = "lost"
        confirmed = {rid: v for rid, v in verdicts.items() if self._verdicts.get(rid) == v}
        self._verdicts = verdicts
        return self._act(confirmed, hashes) if confirmed else 0

    def _off_the_streams(
        self, unseen: list[str], workers: list[str], models: set[str]
    ) -> dict[str, dict]:
        """Of `unseen`, those on no work stream and still not ended, with their hashes."""
        shared = dict.fromkeys([self.keys.work, *(self.keys.work_for_model(m) for m in models)])
        streams = [*shared, *(self.keys.work_for(w) for w in workers)]
        pipe = self.client.pipeline(transaction=True)
        for stream in streams:
            pipe.xrange(stream)
        for request_id in unseen:
            pipe.hgetall(self.keys.request(request_id))
        replies = pipe.execute()
        waiting = {
            fields.get("id")
            for entries in replies[: len(streams)]
            for _, fields in entries
            if fields
        }
        return {
            rid: fields
            for rid, fields in zip(unseen, replies[len(streams) :], strict=True)
            if rid not in waiting
            and fields.get("user_id")
            and fields.get("state") not in protocol.TERMINAL_STATES
        }

    def _act(self, confirmed: dict[str, str], hashes: dict[str, dict]) -> int:
        ended = [rid for rid, verdict in confirmed.items() if verdict == "ended"]
        lost = [rid for rid, verdict in confirmed.items() if verdict == "lost"]
        gone = [rid for rid, verdict in confirmed.items() if verdict == "gone"]
        answers = self._unrecorded(ended, hashes) if ended else []
        pipe = self.client.pipeline(transaction=False)
        for answer in answers:
            log.warning("request %s ended without an answer record: recording it", answer.id)
            transitions.answer_record(pipe, self.keys, answer)
        endings = Endings(self.keys)
        for request_id in lost:
            log.warning("request %s is no longer running anywhere: ending it", request_id)
            fields = hashes[request_id]
            endings.add(
                pipe,
                Answer(
                    id=request_id,
                    user_id=fields["user_id"],
                    conversation_id=fields["conversation_id"],
                    state=State.FAILED,
                    error=outcomes.lost(),
                    worker_id=fields.get("worker", ""),
                    attempt=_int(fields.get("attempt")),
                ),
            )
        if gone:
            log.warning("forgetting %d requests whose state has expired", len(gone))
            pipe.hdel(self.keys.charges, *gone)
            self.running.settled(pipe, gone)
        MetricsBatch(counts={"lost": len(lost)}).write(pipe, self.keys.metrics)
        replies = pipe.execute()
        if endings:
            answers += endings.record(self.client, replies)
        # Settled here, not only when the recorder reads the records: one that never comes
        # (no recorder runs) would otherwise have this pass recording it again and again.
        self.settle(answers)
        return len(answers) + len(gone)

    def _unrecorded(self, request_ids: list[str], hashes: dict[str, dict]) -> list[Answer]:
        """The answers the final events of ended requests describe."""
        pipe = self.client.pipeline(transaction=False)
        for request_id in request_ids:
            pipe.xrevrange(self.keys.output(request_id), count=5)
        answers = []
        for request_id, events in zip(request_ids, pipe.execute(), strict=True):
            fields = hashes[request_id]
            final = next((e for _, e in events if e.get("type") == EventType.FINAL), None)
            if final is None:  # trimmed or expired: the hash still has the end state
                final = {"state": fields["state"], "error": fields.get("error", "")}
            owner = {"user_id": fields["user_id"], "conversation_id": fields["conversation_id"]}
            try:
                answer = protocol.answer_from_final(request_id, final, **owner)
            except (KeyError, ValueError, TypeError) as exc:
                log.error("request %s: its end cannot be read (%s)", request_id, exc)
                answer = Answer(id=request_id, state=State(fields["state"]), **owner)
            answer.worker_id = fields.get("worker", "")
            answers.append(answer)
        return answers


def _charge(raw: str | None) -> tuple[str, str, int, dict] | None:
    """(user id, plan slug, tokens charged, the whole record) from a charges hash entry."""
    if not raw:
        return None
    try:
        charge = json.loads(raw)
        return str(charge["user"]), str(charge["plan"]), int(charge["tokens"]), charge
    except (ValueError, TypeError, KeyError):
        log.error("ignoring an unreadable charge: %.200s", raw)
        return None


def _sample(answer: Answer, record: dict, user_id: str, plan: str) -> Sample | None:
    """What a finished answer teaches the estimator: its real length against the guess (an
    answer stopped or failed midway says nothing about how long it would have been)."""
    real = _int(answer.usage.completion_tokens)
    features = record.get("x")
    if answer.state != State.DONE or real <= 0 or not isinstance(features, list):
        return None
    try:
        return Sample(
            [float(v) for v in features],
            int(record["est"]),
            int(record["max"]),
            user_id,
            plan,
            real,
        )
    except (KeyError, TypeError, ValueError):
        return None


def _float(value, default: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _used(answer: Answer) -> int:
    return _int(answer.usage.prompt_tokens) + _int(answer.usage.completion_tokens)


def _int(value) -> int:
    try:
        return int(value or 0)
    except (ValueError, TypeError):
        return 0
