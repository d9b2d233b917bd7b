"""Per-user layered token buckets in Redis: one Lua script decides a whole batch atomically.

Each user has one hash holding three buckets, all charged together or not at all:
`req` (requests: burst, then requests_per_minute), `tpm` (tokens: burst_tokens, then
tokens_per_minute) and `tpd` (tokens_per_day). A request is charged its estimated tokens (prompt
estimate + max_tokens); when it finishes the difference to the real usage is refunded or charged.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

SCRIPT = (Path(__file__).with_name("buckets.lua")).read_text()

MINUTE_MS = 60_000
DAY_MS = 86_400_000

TAKEN, WAIT, NEVER = 0, 1, 2

# Below this many requests `take_in_background` runs the script at once: the hop to the helper
# thread and back costs more than the little work it would overlap.
BACKGROUND_FROM = 16


@dataclass(frozen=True)
class Bucket:
    """`capacity` units, refilled by `refill` units every `window_ms`; charged `amount`."""

    name: str
    capacity: int
    refill: int
    window_ms: int
    amount: float

    def scaled(self) -> tuple[str, int, int, int]:
        # Scaled by the window, the refill per millisecond is a whole number: see buckets.lua.
        return (
            self.name,
            self.capacity * self.window_ms,
            self.refill,
            round(self.amount * self.window_ms),
        )


@dataclass(frozen=True)
class Decision:
    code: int
    wait_ms: int
    bucket: str  # the bucket that refused, "" when taken

    @property
    def taken(self) -> bool:
        return self.code == TAKEN


def plan_buckets(plan, *, tokens: int, requests: float = 1.0) -> list[Bucket]:
    """The buckets of `plan` (a Plan or anything with its limit attributes), charged a request."""
    return [
        Bucket("req", plan.burst_requests, plan.requests_per_minute, MINUTE_MS, requests),
        Bucket("tpm", plan.burst_tokens, plan.tokens_per_minute, MINUTE_MS, tokens),
        Bucket("tpd", plan.tokens_per_day, plan.tokens_per_day, DAY_MS, tokens),
    ]


# Queues commands on a pipeline; returns what takes their replies.
Alongside = Callable[[Any], Callable[[list], None]]


class BucketStore:
    """Runs the bucket script; `now_ms` None uses Redis TIME (tests inject a clock)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.script = client.register_script(SCRIPT)
        self._helper: ThreadPoolExecutor | None = None

    def take_in_background(
        self,
        requests: list[tuple[str, list[Bucket]]],
        *,
        now_ms: int | None = None,
        alongside: Alongside | None = None,
    ) -> Future[list[Decision]]:
        """`take` on a helper thread, so the caller can do its own work while Redis runs the
        script: the thread waits on the socket without holding the GIL."""
        if len(requests) < BACKGROUND_FROM:
            done: Future[list[Decision]] = Future()
            done.set_result(self.take(requests, now_ms=now_ms, alongside=alongside))
            return done
        if self._helper is None:
            self._helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="buckets")
        return self._helper.submit(self.take, requests, now_ms=now_ms, alongside=alongside)

    def take(
        self,
        requests: list[tuple[str, list[Bucket]]],
        *,
        now_ms: int | None = None,
        alongside: Alongside | None = None,
    ) -> list[Decision]:
        """Charges each (key, buckets) in order, all of a request's buckets or none.
        `alongside` queues more commands to send with the script, in its round trip, and
        returns what takes their replies (which must not raise: the charges are made)."""
        return self._run("take", requests, now_ms, self.client, alongside)

    def adjust(
        self, requests: list[tuple[str, list[Bucket]]], *, now_ms: int | None = None
    ) -> None:
        """Adds each bucket's signed amount (positive refunds), capped at capacity."""
        self._run("adjust", requests, now_ms, self.client)

    def _run(self, mode, requests, now_ms, client, alongside=None) -> list[Decision]:
        if not requests:
            return []
        keys, args = [], ["" if now_ms is None else str(int(now_ms)), mode]
        previous = None
        for key, buckets in requests:
            keys.append(key)
            if buckets is previous:  # callers pass one list for requests of the same size
                args.append(0)  # "the same buckets again": see buckets.lua
                continue
            args.append(len(buckets))
            for bucket in buckets:
                args.extend(bucket.scaled())
            previous = buckets
        if alongside is None:
            raw = self.script(keys=keys, args=args, client=client)
        else:
            raw = self._run_alongside(keys, args, client, alongside)
        triples = zip(requests, raw[0::3], raw[1::3], raw[2::3], strict=True)
        return [
            Decision(int(code), int(wait), buckets[int(which) - 1].name if which else "")
            for (_, buckets), code, wait, which in triples
        ]

    def _run_alongside(self, keys, args, client, alongside: Alongside):
        pipe = client.pipeline(transaction=False)
        received = alongside(pipe)
        others = len(pipe)
        # EVAL, not EVALSHA: a pipeline cannot load a script that Redis lost midway (and a
        # cluster's pipeline refuses EVALSHA); Redis runs the body it has cached by its hash.
        pipe.eval(SCRIPT, len(keys), *keys, *args)
        replies = pipe.execute(raise_on_error=False)
        received(replies[:others])
        raw = replies[others]
        if isinstance(raw, Exception):
            raise raw
        return raw
