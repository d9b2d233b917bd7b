"""The line: the requests admitted and waiting, in Redis and mirrored in memory.

Redis holds the authoritative line, the `queue` hash (request id → encoded `QueuedRequest`),
written only here and always in the same MULTI as the step that changes it: an admission entry
acknowledged, a request handed to a worker or ended. The mirror in memory orders it. Charged
requests wait in the fair queue for a worker; requests their plan's rate holds (not charged yet)
wait per user in arrival order behind the first, which retries when its buckets allow. Deadlines
and stops are watched without walking the line (watch.py).
"""

from __future__ import annotations

import itertools
import json
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
import redis

from apps.admission.fairqueue import BACKGROUND, PEOPLE, Entry, FairQueue
from apps.admission.kinds import is_background
from apps.admission.watch import CancelWatch, DeadlineHeap
from contract import protocol, transitions
from contract.protocol import Answer, Keys, State

log = logging.getLogger("sluice.dispatcher")

ENCODING = 2  # first element of an encoded record: a new layout gets a new number
READABLE = (1, 2)  # 1: before answer-length estimates (the answer reserved max_tokens)
Flow = tuple[str, str]  # (user id, model): whose turn it is in the fair queue


def _dumps(value) -> str:
    """JSON text of a queue or charge record: orjson's, several times faster than the standard
    library's on a prompt-sized record (the dispatcher encodes every request it admits). A value
    orjson refuses (text with a lone surrogate) is written as the standard library writes it."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value)


@dataclass(slots=True)  # tens of thousands may wait: no per-instance __dict__
class QueuedRequest:
    """A request in line. Field order is the encoding's order (see `encode`)."""

    id: str
    user_id: str
    conversation_id: str
    kind: str
    plan: str  # the plan's slug when it was admitted: what its tokens are counted against
    prompt_tokens: int  # the web's estimate
    max_tokens: int  # after the plan's cap and any degradation cap
    weight: float  # the plan's priority weight: its share of the workers
    submitted_ms: int
    deadline_ms: int  # it fails if still waiting then (the plan's max queue wait)
    queued_ns: int  # when it joined its queue: a reload restores the order from this
    charged: bool  # its buckets paid: it waits for a worker in the fair queue
    retry_at_ms: int  # not charged: its plan's rate holds it until then
    held_by: str  # not charged: the bucket that holds it ("req", "tpm" or "tpd")
    fields: dict[str, str]  # the work item as a worker reads it
    estimate: int = 0  # the answer's predicted tokens (estimates.py); 0: max_tokens
    kind_weight: float = 1.0  # the plan's cost weight for its kind
    features: list[float] = field(default_factory=list)  # what the estimate was made from
    # Not stored: after a reload everyone hears their position again.
    told_position: int = 0
    told_at_ms: int = 0
    told_eta_s: int = 0

    @property
    def cost(self) -> int:
        """Estimated tokens times its kind's weight: what its buckets are charged and what
        the fair queue weighs."""
        return round((self.prompt_tokens + (self.estimate or self.max_tokens)) * self.kind_weight)

    @property
    def worst_cost(self) -> int:
        """What it costs if the answer runs to max_tokens: it must fit the plan at all."""
        return round((self.prompt_tokens + self.max_tokens) * self.kind_weight)

    @property
    def model(self) -> str:
        """The model it asked for ("": the default, decided when it is released)."""
        return self.fields.get("model", "")

    def encode(self) -> str:
        # A list, not an object: no keys to write or parse, on the admission hot path.
        return _dumps(
            [
                ENCODING,
                self.id,
                self.user_id,
                self.conversation_id,
                self.kind,
                self.plan,
                self.prompt_tokens,
                self.max_tokens,
                self.weight,
                self.submitted_ms,
                self.deadline_ms,
                self.queued_ns,
                self.charged,
                self.retry_at_ms,
                self.held_by,
                self.fields,
                self.estimate,
                self.kind_weight,
                self.features,
            ]
        )

    @classmethod
    def decode(cls, raw: str) -> QueuedRequest:
        """Raises ValueError or TypeError for a record that is not one."""
        version, *values = json.loads(raw)
        if version not in READABLE:
            raise ValueError(f"unknown queue record layout {version!r}")
        estimate, kind_weight, features = values[15:] if version == 2 else (0, 1.0, [])
        (
            request_id,
            user_id,
            conversation_id,
            kind,
            plan,
            prompt_tokens,
            max_tokens,
            weight,
            submitted,
            deadline,
            queued,
            charged,
            retry_at,
            held_by,
            fields,
        ) = values[:15]
        if not isinstance(fields, dict) or not isinstance(features, list):
            raise TypeError("the work item must be an object, the features a list")
        return cls(
            str(request_id),
            str(user_id),
            str(conversation_id),
            str(kind),
            str(plan),
            int(prompt_tokens),
            int(max_tokens),
            float(weight),
            int(submitted),
            int(deadline),
            int(queued),
            bool(charged),
            int(retry_at),
            str(held_by),
            {str(k): str(v) for k, v in fields.items()},
            int(estimate),
            float(kind_weight),
            [float(v) for v in features],
        )

    def charge_record(self) -> str:
        """What its buckets were charged, kept in the charges hash until its answer settles it,
        with what its answer's real length teaches the estimator and the service times."""
        return _dumps(
            {
                "user": self.user_id,
                "plan": self.plan,
                "tokens": self.cost,
                "w": self.kind_weight,
                "est": self.estimate,
                "max": self.max_tokens,
                "model": self.model,
                "kind": self.kind,
                "x": [round(v, 4) for v in self.features],
            }
        )

    def ended(
        self, state: State, error: str = "", retry_after: int | None = None, code: str = ""
    ) -> Answer:
        """How it ends without running: no text, nothing used."""
        return Answer(
            id=self.id,
            user_id=self.user_id,
            conversation_id=self.conversation_id,
            state=state,
            error=error,
            retry_after=retry_after,
            code=code,
            prompt_tokens_estimate=self.prompt_tokens,
            max_tokens=self.max_tokens,
            model=self.model,  # as asked ("": the default): usage files a refusal under it
        )


class Line:
    def __init__(self, keys: Keys, *, quantum: int) -> None:
        self.keys = keys
        self.quantum = quantum
        self.clear()

    def clear(self) -> None:
        self.requests: dict[str, QueuedRequest] = {}
        self.fair = FairQueue(quantum=self.quantum)
        self.held: dict[str, deque[str]] = {}  # user → ids their plan's rate holds, in order
        self.deadlines = DeadlineHeap()
        self.cancel_watch = CancelWatch()
        self.arrived: list[QueuedRequest] = []  # charged since the last `take_arrived`

    def __len__(self) -> int:
        return len(self.requests)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.requests

    # -- Redis ---------------------------------------------------------------------------------

    def load(self, client: redis.Redis) -> list[str]:
        """Rebuilds the mirror from the queue hash, in the order requests joined. A record that
        cannot be read goes to the dead-letter stream and leaves the line; returns their ids
        (the caller ends those requests)."""
        self.clear()
        loaded, unreadable = [], []
        pipe = client.pipeline(transaction=False)
        for request_id, raw in client.hgetall(self.keys.queue).items():
            try:
                loaded.append(QueuedRequest.decode(raw))
            except (ValueError, TypeError) as exc:
                log.error("queue record %s cannot be read: %s", request_id, exc)
                transitions.dead_letter(
                    pipe,
                    self.keys,
                    source="dispatcher",
                    reason=f"unreadable queue record: {exc}",
                    stream=self.keys.queue,
                    fields={"id": request_id, "record": raw},
                )
                unreadable.append(request_id)
        if unreadable:
            pipe.hdel(self.keys.queue, *unreadable)
            pipe.execute()
        for request in sorted(loaded, key=lambda r: r.queued_ns):
            self.add(request)
        return unreadable

    def store(self, pipe, requests: list[QueuedRequest], encoded: dict[str, str] | None = None):
        """Writes `requests` (joined or changed) to the queue hash; `encoded` holds the
        encodings the caller has made already."""
        if not requests:
            return
        encoded = encoded or {}
        pipe.hset(
            self.keys.queue, mapping={r.id: encoded.get(r.id) or r.encode() for r in requests}
        )
        pipe.expire(self.keys.queue, protocol.ADMISSION_STATE_TTL_SECONDS)

    def leave(self, pipe, requests: list[QueuedRequest]) -> None:
        """`requests` leave the queue hash (to a worker, or ended). A charged request's charge
        moves to the charges hash, where its answer finds it to refund what was not used."""
        if not requests:
            return
        pipe.hdel(self.keys.queue, *(r.id for r in requests))
        charges = {r.id: r.charge_record() for r in requests if r.charged}
        if charges:
            pipe.hset(self.keys.charges, mapping=charges)
            pipe.expire(self.keys.charges, protocol.ADMISSION_STATE_TTL_SECONDS)

    # -- memory (after the Redis write has succeeded) ------------------------------------------

    def add(self, request: QueuedRequest) -> None:
        self.requests[request.id] = request
        self.deadlines.push(request.id, request.deadline_ms)
        self.cancel_watch.add(request.id)
        if request.charged:
            self.fair.push(_entry(request))
            self.arrived.append(request)
        else:
            self.held.setdefault(request.user_id, deque()).append(request.id)

    def forget(self, request_id: str) -> QueuedRequest:
        request = self.requests.pop(request_id)
        if request.charged:
            self.fair.remove(request_id)
        else:
            self._unhold(request)
        return request

    def next_to_run(
        self,
        may_run: Callable[[Flow], bool],
        *,
        background: bool = True,
        background_may_run: Callable[[Flow], bool] | None = None,
    ) -> QueuedRequest | None:
        """Takes the next charged request in fair order among the flows (user, model)
        `may_run` allows (`background_may_run` for background work, which has limits of its
        own): a model without a free slot holds back only its own requests. `background`
        False: background work stays in line."""
        entry = self.fair.pop(
            may_run, background=background, background_eligible=background_may_run
        )
        return None if entry is None else self.requests.pop(entry.id)

    def charged(self, request: QueuedRequest) -> None:
        """A held request whose buckets have now paid (and whose record says so) joins the
        fair queue, at its back."""
        self._unhold(request)
        self.fair.push(_entry(request))
        self.arrived.append(request)

    def take_arrived(self, most: int) -> list[QueuedRequest]:
        """The requests that joined the fair queue since the last call (the first `most` of
        them): those a pass may release first, whose routing reads can be made ahead."""
        arrived, self.arrived = self.arrived[:most], []
        return arrived

    def _unhold(self, request: QueuedRequest) -> None:
        held = self.held.get(request.user_id)
        if held is not None:
            held.remove(request.id)  # the first, as a rule: cheap
            if not held:
                del self.held[request.user_id]

    # -- reading ---------------------------------------------------------------------------------

    def holds(self, user_id: str) -> QueuedRequest | None:
        """The first of the user's requests its plan's rate holds, if any: later requests of
        the user wait behind it."""
        held = self.held.get(user_id)
        return self.requests[held[0]] if held else None

    def first_held(self) -> list[QueuedRequest]:
        return [self.requests[ids[0]] for ids in self.held.values()]

    def order(self) -> list[str]:
        """Every waiting request in release order; those held by their plan's rate last."""
        order = self.fair.release_order()
        for ids in self.held.values():
            order.extend(ids)
        return order

    def head(self, count: int) -> list[str]:
        """The first `count` of `order()`, without computing the rest."""
        order = [entry.id for entry in itertools.islice(self.fair.order(), count)]
        for ids in self.held.values():
            if len(order) >= count:
                break
            order.extend(itertools.islice(ids, count - len(order)))
        return order


def _entry(request: QueuedRequest) -> Entry:
    # The fair queue's turns go to flows, one per user and model, so each model's line is
    # fair among its users and a full model never blocks the others. Background work waits
    # behind every person's request.
    tier = BACKGROUND if is_background(request.kind) else PEOPLE
    return Entry(request.id, (request.user_id, request.model), request.cost, request.weight, tier)
