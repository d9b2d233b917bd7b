"""Deficit round robin over per-user queues, weighted by plan and charged by estimated tokens.

Pure Python and deterministic (no clock, no Redis): the dispatcher keeps one in memory, rebuilt
from Redis when it takes over, and tests drive it directly. Costs are estimated tokens (times
the kind's weight), so a user sending long prompts gets fewer requests through than one sending
short ones.

Two tiers: people's requests, and background work Sluice starts itself. A background entry
leaves only when no person's entry that may run is waiting: it never goes ahead of a person.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass(slots=True)  # one per waiting request: no per-instance __dict__ to allocate and scan
class Entry:
    id: str
    user: str
    cost: int
    weight: float = 1.0
    tier: int = 0  # PEOPLE or BACKGROUND


@dataclass
class _UserQueue:
    entries: deque[Entry] = field(default_factory=deque)
    deficit: float = 0.0
    weight: float = 1.0

    def head(self) -> Entry:
        return self.entries[0]

    def take(self) -> Entry:
        return self.entries.popleft()

    def empty(self) -> bool:
        return not self.entries


class _Shadow:
    """A user's queue as `order` walks it: the real deque is read through an iterator, not
    copied, so walking the first few entries costs nothing per entry further back."""

    __slots__ = ("_head", "_rest", "deficit", "weight")

    def __init__(self, queue: _UserQueue) -> None:
        self.deficit, self.weight = queue.deficit, queue.weight
        self._rest = iter(queue.entries)
        self._head = next(self._rest, None)

    def head(self) -> Entry:
        return self._head

    def take(self) -> Entry:
        head, self._head = self._head, next(self._rest, None)
        return head

    def empty(self) -> bool:
        return self._head is None


PEOPLE, BACKGROUND = 0, 1


class FairQueue:
    """People's entries in fair order, then background entries in fair order among
    themselves: `pop` takes a background entry only when no person's entry may run."""

    def __init__(self, *, quantum: int = 256) -> None:
        self.quantum = quantum
        self.tiers = (_Drr(quantum=quantum), _Drr(quantum=quantum))
        self._tier_of: dict[str, _Drr] = {}

    def __len__(self) -> int:
        return len(self._tier_of)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._tier_of

    def users(self) -> list[str]:
        return list(dict.fromkeys(u for tier in self.tiers for u in tier.users()))

    def user_depth(self, user: str) -> int:
        return sum(tier.user_depth(user) for tier in self.tiers)

    def push(self, entry: Entry) -> None:
        tier = self.tiers[BACKGROUND if entry.tier == BACKGROUND else PEOPLE]
        tier.push(entry)
        self._tier_of[entry.id] = tier

    def remove(self, entry_id: str) -> Entry | None:
        tier = self._tier_of.pop(entry_id, None)
        return None if tier is None else tier.remove(entry_id)

    def waiting(self, tier: int) -> int:
        """How many entries wait in `tier` (PEOPLE or BACKGROUND)."""
        return len(self.tiers[tier])

    def pop(
        self,
        eligible: Callable[[str], bool] = lambda user: True,
        *,
        background: bool = True,
        background_eligible: Callable[[str], bool] | None = None,
    ) -> Entry | None:
        """The next entry; `background` False leaves background entries waiting.
        `background_eligible` (default: `eligible`) decides for the background tier."""
        for tier in self.tiers if background else self.tiers[:1]:
            is_people = tier is self.tiers[PEOPLE]
            entry = tier.pop(eligible if is_people else background_eligible or eligible)
            if entry is not None:
                del self._tier_of[entry.id]
                return entry
        return None

    def order(self, eligible: Callable[[str], bool] = lambda user: True) -> Iterator[Entry]:
        """Entries in the order `pop` would release them (see `_Drr.order`)."""
        for tier in self.tiers:
            yield from tier.order(eligible)

    def release_order(self) -> list[str]:
        return [entry_id for tier in self.tiers for entry_id in tier.release_order()]

    def tier_ids(self, tier: int) -> list[str]:
        """The ids waiting in `tier` (PEOPLE or BACKGROUND), in no particular order."""
        return list(self.tiers[tier]._ids)


class _Drr:
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
        """Entries in the order `pop` would release them, without changing the queue. Costs
        O(users) to start and one DRR step per entry taken: cheap for the head of the line.
        Consume it before the queue changes."""
        users = OrderedDict((u, _Shadow(q)) for u, q in self._users.items())
        in_turn = self._in_turn
        while True:
            result = _pop(users, self.quantum, in_turn, eligible)
            if result is None:
                return
            entry, in_turn = result
            yield entry

    def release_order(self) -> list[str]:
        """Ids of every entry in the order `pop` would release them (all users eligible), as
        `order` gives them but without stepping DRR: entry k of a user leaves in the round in
        which the user's quanta first cover the cost of its entries up to k, and within a round
        users go in rotation order. A stable sort on (round, place in the rotation) then
        reproduces DRR's order several times faster than simulating it, for the whole queue.
        (Weights that are not binary fractions may round differently from DRR's running sums:
        at worst two neighbours swap places.)"""
        keys: list[int] = []
        ids: list[str] = []
        places = len(self._users)
        for place, queue in enumerate(self._users.values()):
            grant = self.quantum * queue.weight
            # The user whose turn it is has had this round's quantum; any other gets its next
            # quantum on its next visit, before it releases anything.
            ahead = 0 if place == 0 and self._in_turn else 1
            need = -queue.deficit
            for entry in queue.entries:
                need += entry.cost
                grants = math.ceil(need / grant) if need > 0 else 0
                keys.append((grants - ahead if grants > ahead else 0) * places + place)
                ids.append(entry.id)
        return [ids[i] for i in sorted(range(len(ids)), key=keys.__getitem__)]

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
            head = queue.head()
            if queue.deficit >= head.cost:
                queue.take()
                queue.deficit -= head.cost
                if queue.empty():
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


def _rounds_needed(queue: _UserQueue | _Shadow, quantum: int) -> int:
    return math.ceil((queue.head().cost - queue.deficit) / (quantum * queue.weight))
