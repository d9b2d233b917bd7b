"""When an event loop's closing stalls, the stack of every task it still waits for.

`asyncio.run` (and asgiref's and pytest-asyncio's runners) end a loop by cancelling its tasks
and waiting for them all. A task that swallows its cancel, or awaits a future nothing will
complete, stops the test there until pytest-timeout ends the whole run: its report then shows
the threads, all idle, and not the task. This prints each remaining task's chain of awaits
(to stderr, which pytest shows for a failed or timed-out test) once a close has waited
STALL_SECONDS.
"""

from __future__ import annotations

import asyncio
import asyncio.runners
import sys
import threading

STALL_SECONDS = 30.0

_cancel_all_tasks = asyncio.runners._cancel_all_tasks


def await_chain(task: asyncio.Task) -> list[str]:
    """`task`'s coroutines, outermost first, down to what the innermost one awaits."""
    lines = [repr(task)]
    awaited = task.get_coro()
    while awaited is not None and len(lines) < 80:
        frame = next(
            (
                getattr(awaited, name)
                for name in ("cr_frame", "gi_frame", "ag_frame")
                if getattr(awaited, name, None) is not None
            ),
            None,
        )
        if frame is None:  # a future's iterator: the future itself is the task's waiter
            lines.append(f"  awaits {getattr(task, '_fut_waiter', None) or awaited!r}")
            break
        lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        awaited = next(
            (
                getattr(awaited, name)
                for name in ("cr_await", "gi_yieldfrom", "ag_await")
                if getattr(awaited, name, None) is not None
            ),
            None,
        )
    return lines


def _report(loop: asyncio.AbstractEventLoop) -> None:
    # Read from another thread while the loop waits in select(): good enough for a report.
    lines = [f"event loop close stalled {STALL_SECONDS:g} s; tasks still running:"]
    for task in list(asyncio.all_tasks(loop)):
        lines.extend(await_chain(task))
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


def _watched_cancel_all_tasks(loop: asyncio.AbstractEventLoop) -> None:
    timer = threading.Timer(STALL_SECONDS, _report, args=(loop,))
    timer.daemon = True
    timer.start()
    try:
        _cancel_all_tasks(loop)
    finally:
        timer.cancel()


def install() -> None:
    asyncio.runners._cancel_all_tasks = _watched_cancel_all_tasks
