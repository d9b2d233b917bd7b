"""What the dispatcher watches about waiting requests without visiting each one every pass.

A queue of 50,000 requests cannot be walked every second: the walk would cost more than the
admission decisions themselves. So deadlines sit in a heap (a sweep touches only the requests
whose deadline has come), and cancel flags are read for a bounded slice of the queue per sweep,
newest requests first (most stops come soon after sending), then round the rest of the queue.
Both forget lazily: an entry for a request that has left the queue is dropped when reached.
"""

from __future__ import annotations

import heapq
from collections import deque


class DeadlineHeap:
    """Queue-wait deadlines of waiting requests, earliest first."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, str]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, request_id: str, deadline_ms: int) -> None:
        heapq.heappush(self._heap, (deadline_ms, request_id))

    def due(self, now_ms: int, waiting: dict) -> list[str]:
        """Ids in `waiting` whose deadline is at or before `now_ms`, removed from the heap."""
        due = []
        while self._heap and self._heap[0][0] <= now_ms:
            _, request_id = heapq.heappop(self._heap)
            if request_id in waiting:
                due.append(request_id)
        self._compact(waiting)
        return due

    def _compact(self, waiting: dict) -> None:
        # Released requests stay in the heap until their deadline; under a long max wait and a
        # fast turnover they would pile up, so rebuild once they outnumber the waiting ones.
        if len(self._heap) > 2 * len(waiting) + 1000:
            self._heap = [(d, i) for d, i in self._heap if i in waiting]
            heapq.heapify(self._heap)


class CancelWatch:
    """Which waiting requests to check for a cancel flag this sweep."""

    def __init__(self) -> None:
        self._fresh: deque[str] = deque()  # queued since the last sweep: checked first
        self._rotation: deque[str] = deque()  # checked before: round and round

    def add(self, request_id: str) -> None:
        self._fresh.append(request_id)

    def next_slice(self, budget: int, waiting: dict) -> list[str]:
        """Up to `budget` ids still in `waiting`: fresh ones, then the longest unchecked."""
        chosen: list[str] = []
        for source in (self._fresh, self._rotation):
            while source and len(chosen) < budget:
                request_id = source.popleft()
                if request_id in waiting:
                    chosen.append(request_id)
        self._rotation.extend(chosen)  # back of the line until every other one has been seen
        return chosen
