"""A circuit breaker per worker: a worker whose answers keep failing stops taking work.

Closed: the worker reads work as usual, and every answer's outcome goes into a sliding window
(`window_seconds`). When more than `error_rate` of the window's answers failed (and the window
holds at least `min_answers`, so one failed answer out of two does not open it), the breaker
opens: the worker stops reading the shared streams, hands its private backlog back to the
shared stream, and its heartbeat says `open`, so the dispatcher routes nothing to it.

After `cooldown_seconds` it is half-open: the worker reads exactly one work item (the probe)
and nothing more until that answer ends. Success closes the breaker with an empty window;
failure opens it again for another cool-down.

The breaker lives in the worker, not the dispatcher: the worker sees its own failures first
(engine errors and answers past their time limit), keeps deciding while the dispatcher fails
over, and a worker with an open breaker must also stop *pulling*, which only it can do.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass(frozen=True)
class BreakerSettings:
    error_rate: float = 0.05  # share of failed answers in the window that opens the breaker
    window_seconds: float = 60.0
    min_answers: int = 10  # fewer answers in the window than this never open it
    cooldown_seconds: float = 30.0  # open this long before one probe is let through

    def __post_init__(self) -> None:
        if not 0 <= self.error_rate < 1:
            raise ValueError("the breaker's error rate must be in [0, 1)")
        if self.window_seconds <= 0 or self.cooldown_seconds < 0 or self.min_answers < 1:
            raise ValueError(
                "the breaker needs a positive window, a cool-down >= 0 and min_answers >= 1"
            )


class CircuitBreaker:
    def __init__(
        self,
        settings: BreakerSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or BreakerSettings()
        self.clock = clock
        self.state = CLOSED
        self.outcomes: deque[tuple[float, bool]] = deque()  # (when, failed)
        self.failures = 0  # failed outcomes in `outcomes`: every answer asks for the rate
        self.opened_at = 0.0
        self.opened = 0  # how many times it has opened
        self.probe: str | None = None  # the request id of the probe in flight
        self.on_open: Callable[[], None] | None = None  # the worker hands its backlog back

    # -- what the read loop asks ----------------------------------------------------------------

    def allowance(self, free: int) -> int:
        """How many work items the worker may read now, out of `free` slots."""
        if self.state == OPEN and self.clock() - self.opened_at >= self.settings.cooldown_seconds:
            self.state = HALF_OPEN
        if self.state == CLOSED:
            return free
        if self.state == HALF_OPEN and self.probe is None:
            return min(free, 1)
        return 0

    def wait_seconds(self) -> float:
        """How long until the breaker may let a probe through (0: not open)."""
        if self.state != OPEN:
            return 0.0
        return max(0.0, self.opened_at + self.settings.cooldown_seconds - self.clock())

    def started(self, request_id: str) -> None:
        """A work item was read: while half-open it is the probe."""
        if self.state == HALF_OPEN and self.probe is None:
            self.probe = request_id

    # -- outcomes ---------------------------------------------------------------------------------

    def record(self, request_id: str, *, failed: bool) -> None:
        now = self.clock()
        if self.state == HALF_OPEN and request_id == self.probe:
            self.probe = None
            if failed:
                self._open(now)
            else:
                self.state = CLOSED
                self._forget_outcomes()
            return
        if self.state != CLOSED:
            return  # answers that were running when it opened: they decide nothing now
        self.outcomes.append((now, failed))
        self.failures += failed
        self._trim(now)
        if self.error_rate_now() > self.settings.error_rate and (
            len(self.outcomes) >= self.settings.min_answers
        ):
            self._open(now)

    def error_rate_now(self) -> float:
        self._trim(self.clock())
        if not self.outcomes:
            return 0.0
        return self.failures / len(self.outcomes)

    def snapshot(self) -> dict:
        """What the heartbeat carries (the dispatcher, the ops page and /metrics read it)."""
        return {
            "state": self.state,
            "error_rate": round(self.error_rate_now(), 4),
            "answers": len(self.outcomes),
            "opened": self.opened,
            "retry_in_s": round(self.wait_seconds(), 1),
        }

    def _open(self, now: float) -> None:
        self.state = OPEN
        self.opened_at = now
        self.opened += 1
        self._forget_outcomes()
        if self.on_open is not None:
            self.on_open()

    def _trim(self, now: float) -> None:
        cutoff = now - self.settings.window_seconds
        while self.outcomes and self.outcomes[0][0] < cutoff:
            self.failures -= self.outcomes.popleft()[1]

    def _forget_outcomes(self) -> None:
        self.outcomes.clear()
        self.failures = 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("circuit breaker")
    options = [
        (
            "--breaker-error-rate",
            float,
            "WORKER_BREAKER_ERROR_RATE",
            0.05,
            "share of failed answers in the window that takes this worker out of routing",
        ),
        (
            "--breaker-window",
            float,
            "WORKER_BREAKER_WINDOW_SECONDS",
            60.0,
            "seconds of answers the error rate is measured over",
        ),
        (
            "--breaker-min-answers",
            int,
            "WORKER_BREAKER_MIN_ANSWERS",
            10,
            "answers the window must hold before it can open the breaker",
        ),
        (
            "--breaker-cooldown",
            float,
            "WORKER_BREAKER_COOLDOWN_SECONDS",
            30.0,
            "seconds out of routing before one probe request is let through",
        ),
    ]
    for flag, kind, env, default, help_text in options:
        group.add_argument(
            flag,
            type=kind,
            default=kind(os.environ.get(env, default)),
            help=f"[{env}] {help_text} (default {default})",
        )


def settings_from_args(args: argparse.Namespace) -> BreakerSettings:
    return BreakerSettings(
        error_rate=args.breaker_error_rate,
        window_seconds=args.breaker_window,
        min_answers=args.breaker_min_answers,
        cooldown_seconds=args.breaker_cooldown,
    )
