"""Requests handed to workers and not settled yet: the `running` hash, mirrored in memory.

The counts per user hold each user to their plan's limits: a person's requests to
`max_concurrent`, background work Sluice starts itself (summaries, titles, follow-ups) to its
own `max_background_concurrent`, so a summary never holds its user's next question back. The
reconciler checks the ones running longest against what the workers and the request hashes
say. Entries leave when the request's answer record is settled (reconcile.py).

What the queue ETA needs of each (its model, its predicted length) and whether it is
background work come from its charge record (line.py), read back on a takeover.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import redis

from apps.admission.kinds import is_background
from apps.admission.line import QueuedRequest
from contract import protocol
from contract.protocol import Keys


@dataclass(slots=True)
class Answering:
    """A running answer as the ETA sees it (see positions.py)."""

    model: str
    tokens: int  # its predicted length
    max_tokens: int
    since_ms: int  # when it was handed to a worker


class Running:
    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.since: dict[str, tuple[str, int]] = {}  # request id → (user id, dispatched ms)
        self.by_user: Counter[str] = Counter()  # people's requests
        self.background_by_user: Counter[str] = Counter()
        self.background: set[str] = set()
        self.answering: dict[str, Answering] = {}

    def __len__(self) -> int:
        return len(self.since)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.since

    def load(self, client: redis.Redis) -> None:
        self.since.clear()
        self.by_user.clear()
        self.background_by_user.clear()
        self.background.clear()
        self.answering.clear()
        running = client.hgetall(self.keys.running)
        charges = client.hmget(self.keys.charges, list(running)) if running else []
        for (request_id, value), raw in zip(running.items(), charges, strict=True):
            user_id, _, since = value.partition("|")
            record = _record(raw)
            # An unreadable time reads as long ago: the reconciler then checks it first.
            self._remember(
                request_id,
                user_id,
                int(since) if since.isdigit() else 0,
                background=is_background(str(record.get("kind") or "")),
                model=str(record.get("model") or ""),
                tokens=_int(record.get("est")) or _int(record.get("max")),
                max_tokens=_int(record.get("max")),
            )

    def count(self, user_id: str) -> int:
        """The user's own requests running: what `max_concurrent` limits."""
        return self.by_user[user_id]

    def count_background(self, user_id: str) -> int:
        return self.background_by_user[user_id]

    def add(self, pipe, request: QueuedRequest, *, model: str, now_ms: int) -> None:
        """`request` handed to a worker of `model`."""
        pipe.hset(self.keys.running, request.id, f"{request.user_id}|{now_ms}")
        self._remember(
            request.id,
            request.user_id,
            now_ms,
            background=is_background(request.kind),
            model=model,
            tokens=request.estimate or request.max_tokens,
            max_tokens=request.max_tokens,
        )

    def keep(self, pipe) -> None:
        pipe.expire(self.keys.running, protocol.ADMISSION_STATE_TTL_SECONDS)

    def settled(self, pipe, request_ids: list[str]) -> None:
        pipe.hdel(self.keys.running, *request_ids)
        for request_id in request_ids:
            entry = self.since.pop(request_id, None)
            self.answering.pop(request_id, None)
            if entry is not None:
                counts = self.by_user
                if request_id in self.background:
                    self.background.discard(request_id)
                    counts = self.background_by_user
                user_id = entry[0]
                counts[user_id] -= 1
                if counts[user_id] <= 0:
                    del counts[user_id]

    def dispatched_before(self, cutoff_ms: int) -> list[str]:
        return [rid for rid, (_, since) in self.since.items() if since <= cutoff_ms]

    def of_model(self, model: str) -> list[Answering]:
        return [a for a in self.answering.values() if a.model == model]

    def _remember(
        self,
        request_id: str,
        user_id: str,
        since_ms: int,
        *,
        background: bool,
        model: str,
        tokens: int,
        max_tokens: int,
    ) -> None:
        if request_id not in self.since:
            if background:
                self.background.add(request_id)
                self.background_by_user[user_id] += 1
            else:
                self.by_user[user_id] += 1
        self.since[request_id] = (user_id, since_ms)
        self.answering[request_id] = Answering(model, tokens, max_tokens or tokens, since_ms)


def _record(raw: str | None) -> dict:
    try:
        record = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _int(value) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0
