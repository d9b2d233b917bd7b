"""Which waiting requests hear their place in line on a pass, within a bound on pushes.

Every release moves everyone behind it, so "push each changed position" would mean a push per
waiting request per pass. Instead the head of the line (the requests about to run, whose users
watch most closely) hears every change; every request hears its first position soon after it
is queued; and the rest hear again once their last news is a few seconds old, the stalest
first, so a deep request is not starved by those nearer the head.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

HEAD = 20  # places told at every change
RETELL_MS = 5000  # further back: at most this often


def positions_to_tell(
    order: Iterable[str], records: dict[str, dict], *, now_ms: int, limit: int
) -> list[tuple[int, str]]:
    """(position, id) pairs to push, at most `limit`: the head's changes, then first positions
    in line order, then the stalest of the rest. `order` is the whole waiting line, or its head
    alone (then only the head hears)."""
    head: list[tuple[int, str]] = []
    first: list[tuple[int, str]] = []
    stale: list[tuple[int, int, str]] = []
    for position, request_id in enumerate(order, start=1):
        record = records[request_id]
        told = record.get("told", 0)
        if told == position:
            continue
        if position <= HEAD:
            head.append((position, request_id))
        elif not told:
            if len(first) < limit:
                first.append((position, request_id))
        elif now_ms - record.get("told_at", 0) >= RETELL_MS:
            stale.append((record.get("told_at", 0), position, request_id))
    chosen = (head + first)[:limit]
    room = limit - len(chosen)
    if room > 0 and stale:
        chosen += [(position, rid) for _, position, rid in heapq.nsmallest(room, stale)]
    return chosen
