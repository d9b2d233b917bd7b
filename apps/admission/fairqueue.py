"""Deficit round robin over per-user queues, weighted by plan and charged by estimated tokens.

Pure Python and deterministic (no clock, no Redis): the dispatcher keeps one in memory, rebuilt
from Redis when it takes over, and tests drive it directly. Costs are estimated tokens, so a
user sending long prompts gets fewer requests through than one sending short ones.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass
class Entry:
    id: str
    user: str
    cost: int
    weight: float = 1.0


@dataclass
class _UserQueue:
    entries: deque[Entry] = field(default_factory=deque)
    deficit: float = 0.0
    weight: float = 1.0


class FairQueue:
    """Each turn a user gains `quantum * weight` and releases while its deficit covers the
    head's cost. Users appear in turn order; a user whose queue empties leaves with no credit.
    """

    def __init__(self, *, quantum: int = 256) -> None:
        self.quantum = quantum
        self._users: OrderedDict[str, _UserQueue] = OrderedDict()  # first = whose turn it is
        self._in_turn = False  # the first user has already received this turn's quantum
        self._ids: dict[str, Entry] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._ids

    def users(self) -> list[str]:
        return list(self._users)

    def user_depth(self, user: str) -> int:
        queue = self._users.get(user)
        return len(queue.entries) if queue else 0

    def push(self, entry: Entry) -> None:
        queue = self._users.get(entry.user)
        if queue is None:
            queue = self._users[entry.user] = _UserQueue(weight=entry.weight)
        queue.weight = entry.weight
        queue.entries.append(entry)
        self._ids[entry.id] = entry

    def remove(self, entry_id: str) -> Entry | None:
        entry = self._ids.pop(entry_id, None)
        if entry is None:
            return None
        queue = self._users[entry.user]
        queue.entries.remove(entry)
        if not queue.entries:
            self._drop_user(entry.user)
        return entry

    def pop(self, eligible: Callable[[str], bool] = lambda user: True) -> Entry | None:
        """The next entry in fair order among users for whom `eligible` is true."""
        entry = _pop(self._users, self.quantum, self._in_turn, eligible)
        if entry is None:
            return None
        popped, self._in_turn = entry
        del self._ids[popped.id]
        return popped

    def order(self, eligible: Callable[[str], bool] = lambda user: True) -> Iterator[Entry]:
        """Entries in the order `pop` would release them, without changing the queue."""
        users = OrderedDict(
            (u, _UserQueue(deque(q.entries), q.deficit, q.weight)) for u, q in self._users.items()
        )
        in_turn = self._in_turn
        while True:
            result = _pop(users, self.quantum, in_turn, eligible)
            if result is None:
                return
            entry, in_turn = result
            yield entry

    def _drop_user(self, user: str) -> None:
        first = next(iter(self._users))
        del self._users[user]
        if user == first:
            self._in_turn = False


def _pop(users, quantum, in_turn, eligible) -> tuple[Entry, bool] | None:
    """One DRR step on `users` (mutated); returns the entry and the new in-turn flag."""
    turns_without_release = 0
    while users:
        user, queue = next(iter(users.items()))
        if eligible(user):
            if not in_turn:
                queue.deficit += quantum * queue.weight
                in_turn = True
            head = queue.entries[0]
            if queue.deficit >= head.cost:
                queue.entries.popleft()
                queue.deficit -= head.cost
                if not queue.entries:
                    del users[user]
                    in_turn = False
                return head, in_turn
        users.move_to_end(user)
        in_turn = False
        turns_without_release += 1
        if turns_without_release >= len(users):
            # A whole round without a release: nobody may run, or every head needs several
            # more quanta; grant those rounds at once instead of looping one quantum at a time.
            candidates = [q for u, q in users.items() if eligible(u)]
            if not candidates:
                return None
            rounds = min(_rounds_needed(q, quantum) for q in candidates)
            if rounds > 1:
                for q in candidates:
                    q.deficit += (rounds - 1) * quantum * q.weight
            turns_without_release = 0
    return None


def _rounds_needed(queue: _UserQueue, quantum: int) -> int:
    return math.ceil((queue.entries[0].cost - queue.deficit) / (quantum * queue.weight))
