"""The request inspector: one request's timeline across the web, the dispatcher and the workers.

Built from what the processes write anyway: the request's hash (owner, state, current attempt,
when it was submitted and dispatched, to which work stream), its output stream (each event's
id is the Redis clock in ms: queued, every position it was told, dispatched, each attempt's
start, the deltas, the final event), the dead-letter stream and the stored answer. Read in one
Redis round trip and one SQL query.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from apps.admission import outcomes
from apps.chat.models import Message
from contract.protocol import OUTPUT_MAXLEN
from core.redis_client import get_redis, keys

DEAD_SCANNED = 1000  # newest dead letters searched for the request


@dataclass
class Step:
    name: str
    at_ms: int | None
    process: str  # web, dispatcher, worker, recorder
    detail: str = ""
    since_previous_ms: int | None = None


@dataclass
class Timeline:
    request_id: str
    found: bool
    request: dict = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    positions: list[tuple[int, int, str]] = field(default_factory=list)  # (ms, place, eta s)
    dead: list[tuple[str, dict]] = field(default_factory=list)
    message: Message | None = None
    outcome: str = ""  # done, failed, cancelled, or what it is doing now
    reason: str = ""  # why it ended in line: rate (bucket), too_large, shed, no_worker, lost

    @property
    def total_ms(self) -> int | None:
        times = [s.at_ms for s in self.steps if s.at_ms]
        return max(times) - min(times) if len(times) > 1 else None


def ended_reason(error: str) -> str:
    """Why the dispatcher ended a request that never ran, from the message the user read (the
    texts are outcomes.py's; a test holds the two together)."""
    checks = [
        ("shed", outcomes.shed(retry_after=60)),
        ("too_large", outcomes.too_large(tokens=1, limit=1)),
        ("no_worker", outcomes.timed_out(waited_s=1)),
        ("rate: tpd (tokens per day)", outcomes.rate_limited(bucket="tpd", wait_s=1)),
        ("rate: req (requests per minute)", outcomes.rate_limited(bucket="req", wait_s=1)),
        ("rate: tpm (tokens per minute)", outcomes.rate_limited(bucket="tpm", wait_s=1)),
        ("lost", outcomes.lost()),
        ("unreadable", outcomes.unreadable()),
    ]
    for reason, text in checks:
        if error.startswith(_stem(text)):
            return reason
    return ""


def _stem(text: str) -> str:
    """The fixed start of an outcome's message, before its first figure."""
    for index, char in enumerate(text):
        if char.isdigit():
            return text[:index]
    return text


def timeline(request_id: str) -> Timeline:
    k = keys()
    pipe = get_redis().pipeline(transaction=False)
    pipe.hgetall(k.request(request_id))
    pipe.xrange(k.output(request_id), count=OUTPUT_MAXLEN)
    pipe.xrevrange(k.dead, count=DEAD_SCANNED)
    request, events, dead = pipe.execute()
    found = Timeline(request_id, bool(request or events))
    found.request = request
    found.dead = [(i, f) for i, f in dead if f.get("request_id") == request_id]
    found.message = Message.objects.filter(request_id=request_id).first()
    if not found.found and found.message is None and not found.dead:
        return found
    _steps(found, request, events)
    return found


def _steps(found: Timeline, request: dict, events: list[tuple[str, dict]]) -> None:
    steps = found.steps
    created = _int(request.get("created_ms"))
    queued_at = next(
        (
            _ms(i)
            for i, e in events
            if e.get("type") == "status" and e.get("state") == "queued" and "position" not in e
        ),
        None,
    )
    steps.append(
        Step(
            "submitted",
            created or queued_at,
            "web",
            f"{request.get('kind', 'chat')} request of user {request.get('user_id', '?')}"
            f", conversation {request.get('conversation_id', '?')}",
        )
    )
    final = next(((i, e) for i, e in events if e.get("type") == "final"), None)
    first_told, first_delta = True, False
    for entry_id, event in events:
        kind, at = event.get("type"), _ms(entry_id)
        if kind == "status" and event.get("position"):
            place, eta = _int(event["position"]), event.get("eta_seconds", "")
            found.positions.append((at, place, eta))
            if first_told:
                held = event.get("reason", "")
                steps.append(
                    Step(
                        "admitted",
                        at,
                        "dispatcher",
                        f"held by its plan's rate: {held}"
                        if held
                        else f"charged; #{place} in line (about {eta} s)",
                    )
                )
                first_told = False
        elif kind == "status" and event.get("state") == "dispatched":
            if first_told:
                steps.append(Step("admitted", at, "dispatcher", "charged; a worker was free"))
                first_told = False
            steps.append(Step("dispatched", at, "dispatcher", _route(request)))
        elif kind == "start":
            worker = event.get("worker", "")
            steps.append(
                Step(
                    f"started (attempt {event.get('attempt', '?')})",
                    at,
                    "worker",
                    f"on {worker}" + _affinity(request, worker),
                )
            )
            first_delta = True
        elif kind == "delta" and first_delta:
            steps.append(Step("first token", at, "worker"))
            first_delta = False
    if final is not None:
        entry_id, event = final
        state, error = event.get("state", ""), event.get("error", "")
        found.outcome = state
        attempt = _int(event.get("attempt"))
        usage = _json(event.get("usage"))
        if attempt == 0 and state == "failed":
            found.reason = ended_reason(error)
            name = (
                "timed out in line"
                if found.reason == "no_worker"
                or (found.positions and found.reason.startswith("rate"))
                else "rejected"
            )
            steps.append(
                Step(name, _ms(entry_id), "dispatcher", f"{found.reason or 'failed'}: {error}")
            )
        else:
            detail = state
            if usage:
                detail += (
                    f": {usage.get('completion_tokens', 0)} tokens, engine ttft "
                    f"{usage.get('ttft_ms')} ms, generation {usage.get('duration_ms')} ms"
                )
            if event.get("finish_reason"):
                detail += f", finish reason {event['finish_reason']}"
            if error:
                detail += f": {error}"
                found.reason = ended_reason(error)
            ender = "dispatcher" if attempt == 0 or found.reason == "lost" else "worker"
            steps.append(Step(f"finished ({state})", _ms(entry_id), ender, detail))
    else:
        found.outcome = request.get("state", "")
    for entry_id, fields in found.dead:
        steps.append(
            Step("dead-lettered", _ms(entry_id), fields.get("source", ""), fields.get("reason", ""))
        )
    if found.message is not None:
        stored = found.message
        steps.append(
            Step(
                "answer stored",
                int(stored.created.timestamp() * 1000),
                "recorder",
                f"message {stored.pk}, {stored.status}",
            )
        )
    # In the order things happened (each step follows from the one before), not sorted by
    # time: the clocks are several machines' and PostgreSQL's, so a step may read a few ms
    # early; such a gap is left blank rather than shown negative.
    previous = None
    for step in steps:
        if step.at_ms and previous and step.at_ms >= previous:
            step.since_previous_ms = step.at_ms - previous
        previous = step.at_ms or previous


def _route(request: dict) -> str:
    route = request.get("route", "")
    k = keys()
    if not route:
        return ""
    if route == k.work:
        return "to the shared work stream"
    model_streams = k.work_for_model("?")[:-1]  # every model's stream name, less the model
    if route.startswith(model_streams):
        return f"to the shared work stream of model {route[len(model_streams) :]}"
    if route.startswith(k.work + ":"):
        return f"to {route.rsplit(':', 1)[-1]}'s affinity stream (its KV cache holds the prefix)"
    return f"to {route}"


def _affinity(request: dict, worker: str) -> str:
    route = request.get("route", "")
    if not route or not worker:
        return ""
    if route == keys().work_for(worker):
        return " (affinity hit)"
    if route.startswith(keys().work + ":"):
        return " (affinity miss: another worker took it over)"
    return ""


def _ms(entry_id: str) -> int:
    return int(entry_id.partition("-")[0])


def _int(value) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _json(raw) -> dict:
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
