"""The one contract between the web, the dispatcher and the workers: Redis key and stream names,
the message schema on each stream, and a request's states.

Django code imports this module; it imports nothing from Django. Every per-request key carries the
request id in a `{hash tag}`, so on a Redis Cluster all of a request's keys share one slot.
Stream entries are flat string maps; structured fields are JSON strings.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from enum import StrEnum
from typing import Any

PROTOCOL_VERSION = "1"

WORKER_GROUP = "workers"  # consumer group of every worker on the work streams
RECORDER_GROUP = "recorder"  # consumer group of the completion recorder on the done stream

# Output streams keep this many entries; deltas are batched (~30 ms each), so this holds far more
# than one answer, and the final event repeats the whole text anyway.
OUTPUT_MAXLEN = 10_000
OUTPUT_TTL_SECONDS = 24 * 3600
REQUEST_TTL_SECONDS = 24 * 3600
CANCEL_TTL_SECONDS = 3600
DONE_MAXLEN = 100_000
DEAD_MAXLEN = 10_000


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


@dataclass(frozen=True)
class Keys:
    """All Redis names under one prefix (tests give each test its own prefix)."""

    prefix: str = "sluice"

    @property
    def admit(self) -> str:
        return f"{self.prefix}:admit"

    @property
    def work(self) -> str:
        return f"{self.prefix}:work"

    def work_for(self, worker_id: str) -> str:
        """A worker's affinity stream: work routed to it because its KV cache holds the prefix."""
        return f"{self.prefix}:work:{worker_id}"

    @property
    def done(self) -> str:
        return f"{self.prefix}:done"

    @property
    def dead(self) -> str:
        return f"{self.prefix}:dead"

    @property
    def workers(self) -> str:
        """Sorted set of worker ids by last heartbeat time (the heartbeat keys hold the detail)."""
        return f"{self.prefix}:workers"

    def heartbeat(self, worker_id: str) -> str:
        return f"{self.prefix}:worker:{worker_id}"

    def request(self, request_id: str) -> str:
        return f"{self.prefix}:req:{{{request_id}}}"

    def output(self, request_id: str) -> str:
        return f"{self.prefix}:out:{{{request_id}}}"

    def cancel(self, request_id: str) -> str:
        return f"{self.prefix}:cancel:{{{request_id}}}"

    def conversation_active(self, conversation_id: int | str) -> str:
        """The request currently generating in a conversation, so a new tab can resume it."""
        return f"{self.prefix}:conv:{{{conversation_id}}}:active"

    def reclaim_lock(self, worker_id: str) -> str:
        return f"{self.prefix}:reclaim:{worker_id}"


def new_request_id() -> str:
    return uuid.uuid4().hex


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class WorkItem:
    """A generation to run, as it travels on the admission and work streams."""

    id: str
    user_id: str
    conversation_id: str
    messages: list[dict[str, str]]  # [{"role": "system"|"user"|"assistant", "content": ...}]
    max_tokens: int = 512
    temperature: float = 0.7
    prompt_tokens_estimate: int = 0
    kind: str = "chat"  # request type, weighted by the plan's cost weights
    plan: str = ""
    submitted_ms: int = field(default_factory=now_ms)
    v: str = PROTOCOL_VERSION

    def to_fields(self) -> dict[str, str]:
        # Field by field: asdict() would deep-copy every message first, on the hot path.
        data = {f.name: getattr(self, f.name) for f in dataclass_fields(self)}
        data["messages"] = json.dumps(self.messages)
        return {k: str(v) for k, v in data.items()}

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> WorkItem:
        if fields.get("v") != PROTOCOL_VERSION:
            raise ValueError(f"unsupported work item version {fields.get('v')!r}")
        return cls(
            id=fields["id"],
            user_id=fields["user_id"],
            conversation_id=fields["conversation_id"],
            messages=json.loads(fields["messages"]),
            max_tokens=int(fields["max_tokens"]),
            temperature=float(fields["temperature"]),
            prompt_tokens_estimate=int(fields.get("prompt_tokens_estimate", 0)),
            kind=fields.get("kind", "chat"),
            plan=fields.get("plan", ""),
            submitted_ms=int(fields.get("submitted_ms", 0)),
        )


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float | None = None
    duration_ms: float | None = None


@dataclass
class Completion:
    """What the done stream carries to the recorder: the outcome of one request."""

    id: str
    user_id: str
    conversation_id: str
    state: State
    text: str
    usage: Usage
    error: str = ""
    worker_id: str = ""
    prompt_tokens_estimate: int = 0
    max_tokens: int = 0

    def to_fields(self) -> dict[str, str]:
        return {
            "v": PROTOCOL_VERSION,
            "id": self.id,
            "user_id": self.user_id,
            "conversation_id": self.conversation_id,
            "state": str(self.state),
            "text": self.text,
            "usage": json.dumps(asdict(self.usage)),
            "error": self.error,
            "worker_id": self.worker_id,
            "prompt_tokens_estimate": str(self.prompt_tokens_estimate),
            "max_tokens": str(self.max_tokens),
        }

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> Completion:
        return cls(
            id=fields["id"],
            user_id=fields["user_id"],
            conversation_id=fields["conversation_id"],
            state=State(fields["state"]),
            text=fields.get("text", ""),
            usage=Usage(**json.loads(fields.get("usage") or "{}")),
            error=fields.get("error", ""),
            worker_id=fields.get("worker_id", ""),
            prompt_tokens_estimate=int(fields.get("prompt_tokens_estimate") or 0),
            max_tokens=int(fields.get("max_tokens") or 0),
        )


def status_event(state: State, **extra: Any) -> dict[str, str]:
    return {"type": EventType.STATUS, "state": state, **{k: str(v) for k, v in extra.items()}}


def start_event(*, attempt: int, worker_id: str) -> dict[str, str]:
    return {"type": EventType.START, "attempt": str(attempt), "worker": worker_id}


def delta_event(text: str) -> dict[str, str]:
    return {"type": EventType.DELTA, "text": text}


def final_event(completion: Completion) -> dict[str, str]:
    return {
        "type": EventType.FINAL,
        "state": str(completion.state),
        "text": completion.text,
        "usage": json.dumps(asdict(completion.usage)),
        "error": completion.error,
    }
