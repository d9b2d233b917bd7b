"""Which worker's KV cache likely holds a prompt: kept in Redis, so a standby dispatcher that
takes over routes a conversation back to the worker that served it, as the old holder would.

Two kinds of entry, each a string with a TTL under the dispatcher's hash tag:

- `conv`: conversation → the worker that answered it last. Its next prompt repeats the whole
  conversation, so that worker holds all of it but the newest turn.
- `prefix`: fingerprint of the prompt's system message (the system prompt with the user's
  profile and the conversation's summary; an API client's shared system prompt) → the worker
  that read it last. A new conversation of the same user, or the next request on the same
  system prompt, finds that part already computed there.

The TTL (`SLUICE_AFFINITY_TTL_SECONDS`) bounds how long a cache is trusted: a GPU under load
evicts an idle conversation's blocks within minutes, and a stale entry costs only a routing
choice that the load check can still overrule. Every answer refreshes its entries. What is
learnt is written on the dispatcher's next pass, with its read of the fleet; what a pass routes
is read in one MGET, which for the requests that arrived since the last pass rides with that
read too (`read_ahead`): a request that finds a free slot waits on no round trip of its own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis

from apps.admission.line import QueuedRequest
from contract.protocol import Answer, Keys

REMEMBERED_ROUTES = 100_000  # request → its fingerprint, until its answer arrives


@dataclass(frozen=True)
class PromptShape:
    """What routing needs to know of a prompt: its prefix fingerprint ("" when it has no system
    message) and the shares of its characters a warm cache would skip."""

    fingerprint: str
    prefix_share: float  # the system message's share of the prompt
    history_share: float  # all but the newest message: what the conversation's worker holds


def prompt_shape(messages_json: str) -> PromptShape:
    try:
        messages = json.loads(messages_json)
        contents = [str(m.get("content", "")) for m in messages]
        system = str(messages[0].get("content", "")) if messages[0].get("role") == "system" else ""
    except (ValueError, TypeError, AttributeError, IndexError, KeyError):
        return PromptShape("", 0.0, 0.0)
    total = sum(len(c) for c in contents) or 1
    fingerprint = hashlib.blake2b(system.encode(), digest_size=8).hexdigest() if system else ""
    return PromptShape(fingerprint, len(system) / total, 1 - len(contents[-1]) / total)


class AffinityStore:
    def __init__(self, client: redis.Redis, keys: Keys, *, ttl_seconds: int) -> None:
        self.client = client
        self.keys = keys
        self.ttl_seconds = ttl_seconds
        self._learnt: dict[str, str] = {}  # key → worker, written on the next flush
        self._routed: dict[str, str] = {}  # request id → its prefix fingerprint
        self._read: dict[str, str | None] = {}  # entry → its worker, read ahead this pass
        self._shapes: dict[str, PromptShape] = {}  # request id → its shape, read ahead

    def shape(self, request: QueuedRequest) -> PromptShape:
        shape = self._shapes.pop(request.id, None)
        return shape or prompt_shape(request.fields.get("messages", ""))

    def read_ahead(self, pipe, requests: Sequence[QueuedRequest]) -> Callable[[list], None]:
        """Queues on `pipe` the entries of `requests` (those this pass may route), for
        `lookup` to use; what was read ahead before is dropped. Returns what takes the
        pipeline's replies from the MGET on (a failed read is made again by `lookup`)."""
        self._read, self._shapes = {}, {}
        if not requests:
            return lambda replies: None
        self._shapes = {r.id: self.shape(r) for r in requests}
        names = self._names([(r.conversation_id, self._shapes[r.id].fingerprint) for r in requests])
        pipe.mget(names)

        def received(replies: list) -> None:
            if replies and isinstance(replies[0], list):
                self._read = dict(zip(names, replies[0], strict=True))

        return received

    def _names(self, pairs: list[tuple[str, str]]) -> list[str]:
        return [
            self.keys.affinity(kind, name)
            for conversation, fingerprint in pairs
            for kind, name in (("conv", conversation), ("prefix", fingerprint))
        ]

    def routed(self, request_id: str, fingerprint: str) -> None:
        """Remembers the request's fingerprint until its answer says which worker read it."""
        if fingerprint:
            if len(self._routed) >= REMEMBERED_ROUTES:
                self._routed.pop(next(iter(self._routed)))
            self._routed[request_id] = fingerprint

    def learn(self, answer: Answer) -> None:
        fingerprint = self._routed.pop(answer.id, "")
        if not answer.worker_id:
            return
        if answer.conversation_id:
            self._learnt[self.keys.affinity("conv", answer.conversation_id)] = answer.worker_id
        if fingerprint:
            self._learnt[self.keys.affinity("prefix", fingerprint)] = answer.worker_id

    def flush(self, pipe=None) -> Callable[[list], None]:
        """Writes what was learnt since the last flush: in a round trip of its own (none when
        nothing), or queued on the caller's `pipe`. Returns what takes that pipeline's replies
        from these commands on: a failed write raises, as it does alone, and is kept for the
        next flush."""
        learnt, self._learnt = self._learnt, {}
        own = pipe is None and bool(learnt)
        if own:
            pipe = self.client.pipeline(transaction=False)
        for key, worker_id in learnt.items():
            pipe.set(key, worker_id, ex=self.ttl_seconds)

        def written(replies: list) -> None:
            failed = [r for r in replies[: len(learnt)] if isinstance(r, Exception)]
            if failed:
                self._learnt = {**learnt, **self._learnt}
                raise failed[0]

        if own:
            written(pipe.execute(raise_on_error=False))
        return written

    def lookup(self, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """For each (conversation, fingerprint): (its conversation's worker, its prefix's
        worker), "" where none is remembered. What this pass learnt but has not written yet
        counts too; what was read ahead is not read again (and is used once)."""
        if not pairs:
            return []
        names = self._names(pairs)
        read, self._read = self._read, {}
        missing = [name for name in names if name not in read]
        if missing:
            read.update(zip(missing, self.client.mget(missing), strict=True))
        found = [self._learnt.get(name) or read[name] or "" for name in names]
        return list(zip(found[0::2], found[1::2], strict=True))
