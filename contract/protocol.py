"""The one contract between the web, the dispatcher and the workers: Redis key and stream names,
the message schema on each stream, and a request's states.

Words (docs/architecture.md has the glossary): a *request* has an id and a state machine and
produces one *answer*; the worker's view of a request is a *work item*, delivered on a work
stream; each time a worker starts running it is an *attempt*, and only the current attempt may
write the request's events.

Django code imports this module; it imports nothing from Django. Every per-request key carries the
request id in a `{hash tag}`, so on a Redis Cluster all of a request's keys share one slot; the
dispatcher's own keys share the `{adm}` tag. Stream entries are flat string maps; structured
fields are JSON strings. Only `contract/transitions.py` writes a request's state and events.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from enum import StrEnum

from contract.keys import FLEET_TAG, Keys

__all__ = ["FLEET_TAG", "Keys"]  # the contract's names, kept where every reader looks

# Written in every work item, answer record and heartbeat. Raised only for a change an older
# reader would misread; a reader accepts every version in READABLE_VERSIONS and ignores fields it
# does not know, so new optional fields need no new version (docs/deploy.md: rolling upgrades).
PROTOCOL_VERSION = "1"
READABLE_VERSIONS = frozenset({"1"})

WORKER_GROUP = "workers"  # consumer group of every worker on the work streams
RETURNED = "returned"  # a given-back work item's mark: not a first delivery (worker/ahead.py)
RECORDER_GROUP = "recorder"  # consumer group of the answer recorder on the done stream
DISPATCHER_GROUP = "dispatcher"  # consumer group of the dispatcher on the admission stream
# One consumer name for whichever dispatcher holds the lease: a new holder re-reads what the old
# one had been delivered but not yet acknowledged.
ACTIVE_CONSUMER = "active"


# Output streams keep this many entries; deltas are batched (~30 ms each), so this holds far more
# than one answer, and the final event repeats the whole text anyway.
OUTPUT_MAXLEN = 10_000
OUTPUT_TTL_SECONDS = 24 * 3600
REQUEST_TTL_SECONDS = 24 * 3600
CANCEL_TTL_SECONDS = 3600
DONE_MAXLEN = 100_000
DEAD_MAXLEN = 10_000
# The dispatcher's queue, charges and running hashes: refreshed on every write.
ADMISSION_STATE_TTL_SECONDS = 7 * 24 * 3600
METRICS_TTL_SECONDS = 30 * 24 * 3600


class State(StrEnum):
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    STREAMING = "streaming"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES = frozenset({State.DONE, State.FAILED, State.CANCELLED})


class EventType(StrEnum):
    """Entry types on a request's output stream, in the order a reader sees them."""

    STATUS = "status"  # state change, queue position, ETA
    START = "start"  # a worker begins an attempt: readers drop text from earlier attempts
    DELTA = "delta"  # a batch of generated text
    FINAL = "final"  # the end: state, whole text, usage or error


def new_request_id() -> str:
    return uuid.uuid4().hex


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class WorkItem:
    """A request to answer, as it travels on the admission and work streams."""

    id: str
    user_id: str
    conversation_id: str
    # [{"role": "system"|"user"|"assistant", "content": ...}]; through the OpenAI API also
    # "tool" messages (with `tool_call_id`) and assistant messages with `tool_calls`, sent only
    # to models whose every worker serves tools.
    messages: list[dict]
    max_tokens: int = 512
    temperature: float = 0.7
    prompt_tokens_estimate: int = 0
    kind: str = "chat"  # request type, weighted by the plan's cost weights
    submitted_ms: int = field(default_factory=now_ms)
    v: str = PROTOCOL_VERSION
    # The model to answer with ("": the default one, chosen by the dispatcher).
    model: str = ""
    top_p: float | None = None  # None: the engine's (or the model's) own default
    stop: list[str] = field(default_factory=list)  # the answer ends before any of these
    # A background request's task ({"task": "summary", ...}): its answer goes to that task.
    purpose: dict = field(default_factory=dict)
    # What the OpenAI API passes on to the engine. Left out of the entry when unset, so entries
    # without them read as before; a worker of the previous release ignores them, and the web
    # sends them only to models whose every worker announces it serves them
    # (contract/capabilities.py).
    response_format: dict = field(default_factory=dict)  # {}: plain text
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    tools: list[dict] = field(default_factory=list)  # OpenAI's function tools; []: none
    tool_choice: str | dict | None = None  # None: auto when there are tools
    parallel_tool_calls: bool | None = None  # None: allowed
    # None: no log probabilities; else each token's, with this many likeliest alternatives.
    logprobs: int | None = None
    logit_bias: dict = field(default_factory=dict)  # token id (as text) -> bias; {}: none

    def to_fields(self) -> dict[str, str]:
        # Field by field: asdict() would deep-copy every message first, on the hot path.
        data = {f.name: getattr(self, f.name) for f in dataclass_fields(self)}
        data["messages"] = json.dumps(self.messages)
        data["top_p"] = "" if self.top_p is None else self.top_p
        data["stop"] = json.dumps(self.stop) if self.stop else ""
        data["purpose"] = json.dumps(self.purpose) if self.purpose else ""
        for name in OPTIONAL_SAMPLING:
            if data[name] is None:
                del data[name]
        for name in OPTIONAL_JSON:
            if data[name] in (None, [], {}):
                del data[name]
            else:
                data[name] = json.dumps(data[name])
        return {k: str(v) for k, v in data.items()}

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> WorkItem:
        """Raises KeyError or ValueError for an entry that is not a work item."""
        if fields.get("v") not in READABLE_VERSIONS:
            raise ValueError(f"unsupported work item version {fields.get('v')!r}")
        messages = json.loads(fields["messages"])
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages
        ):
            raise ValueError("messages must be a list of {role, content}")
        return cls(
            id=fields["id"],
            user_id=fields["user_id"],
            conversation_id=fields["conversation_id"],
            messages=messages,
            max_tokens=int(fields["max_tokens"]),
            temperature=float(fields["temperature"]),
            prompt_tokens_estimate=int(fields.get("prompt_tokens_estimate", 0)),
            kind=fields.get("kind", "chat"),
            submitted_ms=int(fields.get("submitted_ms", 0)),
            model=fields.get("model", ""),
            top_p=float(fields["top_p"]) if fields.get("top_p") else None,
            stop=_stop_list(fields.get("stop")),
            purpose=dict(json.loads(fields.get("purpose") or "{}")),
            response_format=dict(json.loads(fields.get("response_format") or "{}")),
            seed=int(fields["seed"]) if fields.get("seed") else None,
            presence_penalty=_float_or_none(fields.get("presence_penalty")),
            frequency_penalty=_float_or_none(fields.get("frequency_penalty")),
            tools=list(json.loads(fields.get("tools") or "[]")),
            tool_choice=json.loads(fields["tool_choice"]) if fields.get("tool_choice") else None,
            parallel_tool_calls=json.loads(fields.get("parallel_tool_calls") or "null"),
            logprobs=int(fields["logprobs"]) if fields.get("logprobs") else None,
            logit_bias=dict(json.loads(fields.get("logit_bias") or "{}")),
        )


OPTIONAL_SAMPLING = ("seed", "presence_penalty", "frequency_penalty", "logprobs")
# Fields written as JSON, and left out when unset.
OPTIONAL_JSON = ("response_format", "tools", "tool_choice", "parallel_tool_calls", "logit_bias")


def _float_or_none(raw: str | None) -> float | None:
    return float(raw) if raw else None


def _stop_list(raw: str | None) -> list[str]:
    stop = json.loads(raw) if raw else []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ValueError("stop must be a list of strings")
    return stop


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float | None = None
    duration_ms: float | None = None
    cached_tokens: int = 0  # prompt tokens found in the engine's KV cache (not read again)


@dataclass
class Answer:
    """How a request ended: what the final event shows readers and what the done stream
    carries to the recorder (which stores it in PostgreSQL) and the dispatcher (which settles
    the user's charge)."""

    id: str
    user_id: str
    conversation_id: str
    state: State
    text: str = ""
    usage: Usage = field(default_factory=Usage)
    error: str = ""
    worker_id: str = ""
    # Why the text ended: "stop" (the model finished), "length" (the answer cap), "" when it
    # did not run to an end (stopped, failed, rejected).
    finish_reason: str = ""
    attempt: int = 0  # 0: ended without running (rejected, timed out or stopped in line)
    retry_after: int | None = None  # seconds, for a rejection that waiting can fix
    # Why the dispatcher refused it, for programs (`error` is for people): "rate_limited",
    # "too_large", "shed", "no_worker", "model_not_allowed"; or "engine_refused": the worker's
    # engine cannot serve what it asks (contract/capabilities.py); "" otherwise.
    code: str = ""
    prompt_tokens_estimate: int = 0
    max_tokens: int = 0
    # The model that answered ("" when none ran, or the record predates the field): what usage
    # accounting files the answer's tokens under.
    model: str = ""
    # The tool calls the answer makes, in OpenAI's shape (worker/tool_calls.py); finish_reason
    # is then "tool_calls" and `text` holds what the model wrote besides them. Left out of the
    # record when there are none, so a reader of the previous release reads it as before.
    tool_calls: list[dict] = field(default_factory=list)
    # Every token's log probability, in OpenAI's shape, when the request asks for them (None:
    # not asked). Only the final event carries them: readers of the done stream have no use.
    logprobs: list[dict] | None = None

    def to_fields(self) -> dict[str, str]:
        fields = {
            "v": PROTOCOL_VERSION,
            "id": self.id,
            "user_id": self.user_id,
            "conversation_id": self.conversation_id,
            "state": str(self.state),
            "text": self.text,
            "usage": json.dumps(asdict(self.usage)),
            "error": self.error,
            "worker_id": self.worker_id,
            "finish_reason": self.finish_reason,
            "attempt": str(self.attempt),
            "prompt_tokens_estimate": str(self.prompt_tokens_estimate),
            "max_tokens": str(self.max_tokens),
        }
        if self.retry_after is not None:
            fields["retry_after"] = str(int(self.retry_after))
        if self.code:
            fields["code"] = self.code
        if self.model:
            fields["model"] = self.model
        if self.tool_calls:
            fields["tool_calls"] = json.dumps(self.tool_calls)
        return fields

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> Answer:
        """Raises KeyError, ValueError or TypeError for a record that is not an answer."""
        usage = json.loads(fields.get("usage") or "{}")
        if not isinstance(usage, dict):
            raise ValueError("usage must be a JSON object")
        retry_after = fields.get("retry_after")
        return cls(
            id=fields["id"],
            user_id=fields["user_id"],
            conversation_id=fields["conversation_id"],
            state=State(fields["state"]),
            text=fields.get("text", ""),
            usage=Usage(**usage),
            error=fields.get("error", ""),
            worker_id=fields.get("worker_id", ""),
            finish_reason=fields.get("finish_reason", ""),
            attempt=int(fields.get("attempt") or 0),
            retry_after=int(retry_after) if retry_after else None,
            code=fields.get("code", ""),
            prompt_tokens_estimate=int(fields.get("prompt_tokens_estimate") or 0),
            max_tokens=int(fields.get("max_tokens") or 0),
            model=fields.get("model", ""),
            tool_calls=list(json.loads(fields.get("tool_calls") or "[]")),
        )


def final_fields(answer: Answer) -> dict[str, str]:
    """The final event on the output stream: what every reader shows at the end."""
    fields = {
        "type": EventType.FINAL,
        "state": str(answer.state),
        "text": answer.text,
        "usage": json.dumps(asdict(answer.usage)),
        "error": answer.error,
        "finish_reason": answer.finish_reason,
        "attempt": str(answer.attempt),
    }
    if answer.retry_after is not None:
        fields["retry_after"] = str(int(answer.retry_after))
    if answer.code:
        fields["code"] = answer.code
    if answer.tool_calls:
        fields["tool_calls"] = json.dumps(answer.tool_calls)
    if answer.logprobs is not None:
        fields["logprobs"] = json.dumps(answer.logprobs)
    return fields


def answer_from_final(
    request_id: str, fields: dict[str, str], *, user_id: str, conversation_id: str
) -> Answer:
    """The answer a final event describes (for readers that settle a request themselves)."""
    return Answer.from_fields(
        {**fields, "id": request_id, "user_id": user_id, "conversation_id": conversation_id}
    )
