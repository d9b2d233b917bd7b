"""The bookkeeping that spares the dispatcher a walk of the whole queue: deadlines due and the
slice of cancel flags to read."""

from __future__ import annotations

from apps.admission.watch import CancelWatch, DeadlineHeap


def test_only_waiting_requests_whose_deadline_came_are_due():
    heap = DeadlineHeap()
    for i in range(10):
        heap.push(f"r{i}", 1000 + i * 100)
    waiting = {f"r{i}": {} for i in range(10) if i != 2}  # r2 has left the queue
    assert heap.due(1250, waiting) == ["r0", "r1"]
    assert heap.due(1250, waiting) == []
    assert heap.due(10_000, waiting) == [f"r{i}" for i in range(3, 10)]


def test_deadlines_of_requests_gone_do_not_pile_up():
    heap = DeadlineHeap()
    for i in range(5000):
        heap.push(f"r{i}", 10**9 + i)  # far in the future; all but one then released
    waiting = {"r4999": {}}
    assert heap.due(0, waiting) == []
    assert len(heap) <= 1001
    assert heap.due(2 * 10**9, waiting) == ["r4999"]


def test_new_requests_are_checked_first_then_the_rest_in_turn():
    watch = CancelWatch()
    waiting = {}
    for i in range(6):
        watch.add(f"r{i}")
        waiting[f"r{i}"] = {}
    assert watch.next_slice(4, waiting) == ["r0", "r1", "r2", "r3"]
    watch.add("new")
    waiting["new"] = {}
    del waiting["r5"]
    assert watch.next_slice(3, waiting) == ["r4", "new", "r0"]  # never checked, then the oldest
    assert watch.next_slice(3, waiting) == ["r1", "r2", "r3"]
