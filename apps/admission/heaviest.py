"""The heaviest users of the last hour, as the operations page lists them: tokens, requests and
requests that ended failed without running, per user.

Counted per minute, in memory for the page and in Redis (one hash per minute under the
dispatcher's hash tag, written in the same round trip that settles the answers), so the
dispatcher that takes over, even from one that was killed, shows the same table. Before, the
table lived only in the active dispatcher's memory and a takeover started it empty.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable

import redis

from contract.protocol import Answer, Keys, State

WINDOW_MINUTES = 60
TOP_USERS = 10
KINDS = ("t", "r", "x")  # tokens, requests, rejections: a field is "<kind>:<user id>"


class HeaviestUsers:
    def __init__(self, client: redis.Redis, keys: Keys, *, now_ms: Callable[[], int]) -> None:
        self.client = client
        self.keys = keys
        self.now_ms = now_ms
        # Per minute, oldest first: (minute, {kind: Counter of user → count}).
        self._minutes: deque[tuple[int, dict[str, Counter[str]]]] = deque()

    def key(self, minute: int) -> str:
        return f"{self.keys.series}:users:{minute}"  # the series' hash tag: one slot

    def count(self, pipe, answers: Iterable[Answer]) -> None:
        """Counts settled answers, and queues the same counts on `pipe` for Redis."""
        minute = self.now_ms() // 60_000
        counts = self._minute(minute)
        added: Counter[str] = Counter()
        for answer in answers:
            user = answer.user_id
            used = int(answer.usage.prompt_tokens or 0) + int(answer.usage.completion_tokens or 0)
            added[f"r:{user}"] += 1
            added[f"t:{user}"] += used
            if answer.attempt <= 0 and answer.state == State.FAILED:
                added[f"x:{user}"] += 1
        for field, value in added.items():
            kind, _, user = field.partition(":")
            counts[kind][user] += value
            if value:
                pipe.hincrby(self.key(minute), field, value)
        if added:
            pipe.expire(self.key(minute), (WINDOW_MINUTES + 1) * 60)

    def load(self) -> None:
        """The last hour from Redis: what a new lease holder starts from."""
        now = self.now_ms() // 60_000
        minutes = list(range(now - WINDOW_MINUTES + 1, now + 1))
        pipe = self.client.pipeline(transaction=False)
        for minute in minutes:
            pipe.hgetall(self.key(minute))
        self._minutes.clear()
        for minute, fields in zip(minutes, pipe.execute(), strict=True):
            if not fields:
                continue
            counts = _empty()
            for field, value in fields.items():
                kind, _, user = field.partition(":")
                if kind in counts and value.lstrip("-").isdigit():
                    counts[kind][user] += int(value)
            self._minutes.append((minute, counts))

    def top(self) -> list[dict]:
        total = _empty()
        for _, counts in self._minutes:
            for kind in KINDS:
                total[kind].update(counts[kind])
        tokens, requests, rejections = (total[kind] for kind in KINDS)
        users = sorted(requests, key=lambda u: (tokens[u], requests[u]), reverse=True)
        return [
            {"user": u, "tokens": tokens[u], "requests": requests[u], "rejections": rejections[u]}
            for u in users[:TOP_USERS]
        ]

    def _minute(self, minute: int) -> dict[str, Counter[str]]:
        if not self._minutes or self._minutes[-1][0] != minute:
            self._minutes.append((minute, _empty()))
            while self._minutes and self._minutes[0][0] <= minute - WINDOW_MINUTES:
                self._minutes.popleft()
        return self._minutes[-1][1]


def _empty() -> dict[str, Counter[str]]:
    return {kind: Counter() for kind in KINDS}
