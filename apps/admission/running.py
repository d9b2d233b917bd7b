"""Requests handed to workers and not settled yet: the `running` hash, mirrored in memory.

The counts per user hold each user to their plan's max_concurrent; the reconciler checks the
ones running longest against what the workers and the request hashes say. Entries leave when
the request's answer record is settled (reconcile.py).
"""

from __future__ import annotations

from collections import Counter

import redis

from worker import protocol
from worker.protocol import Keys


class Running:
    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.since: dict[str, tuple[str, int]] = {}  # request id → (user id, dispatched ms)
        self.by_user: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self.since)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.since

    def load(self, client: redis.Redis) -> None:
        self.since.clear()
        self.by_user.clear()
        for request_id, value in client.hgetall(self.keys.running).items():
            user_id, _, since = value.partition("|")
            # An unreadable time reads as long ago: the reconciler then checks it first.
            self._remember(request_id, user_id, int(since) if since.isdigit() else 0)

    def count(self, user_id: str) -> int:
        return self.by_user[user_id]

    def add(self, pipe, request_id: str, user_id: str, *, now_ms: int) -> None:
        pipe.hset(self.keys.running, request_id, f"{user_id}|{now_ms}")
        self._remember(request_id, user_id, now_ms)

    def keep(self, pipe) -> None:
        pipe.expire(self.keys.running, protocol.ADMISSION_STATE_TTL_SECONDS)

    def settled(self, pipe, request_ids: list[str]) -> None:
        pipe.hdel(self.keys.running, *request_ids)
        for request_id in request_ids:
            entry = self.since.pop(request_id, None)
            if entry is not None:
                user_id = entry[0]
                self.by_user[user_id] -= 1
                if self.by_user[user_id] <= 0:
                    del self.by_user[user_id]

    def dispatched_before(self, cutoff_ms: int) -> list[str]:
        return [rid for rid, (_, since) in self.since.items() if since <= cutoff_ms]

    def _remember(self, request_id: str, user_id: str, since_ms: int) -> None:
        if request_id not in self.since:
            self.by_user[user_id] += 1
        self.since[request_id] = (user_id, since_ms)
