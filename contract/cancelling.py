"""Stopping a task without losing the stopper's own cancellation.

`task.cancel()` then `with suppress(CancelledError): await task` swallows every CancelledError
that await raises, the caller's own included: a caller cancelled while it waits (a worker's
shutdown, an event loop closing, which cancels every task once and waits for them all) carries
on as if nothing had happened, and a loop that does this never ends. The same holds for
`asyncio.wait_for` on Python 3.11, which returns the result instead of raising when the caller
is cancelled in the step its awaitable completes; `asyncio.timeout` does not, and is what loops
here use. redis-py's asyncio client writes every command through `asyncio.wait_for`, so a
task cancelled just as a write of its completes carries on from that write as if it had not
been asked to stop: loops that run for a process's life call `raise_if_cancelled` at the top of
each turn, or an event loop's close would wait for them forever.
"""

from __future__ import annotations

import asyncio


def raise_if_cancelled() -> None:
    """Raises CancelledError when the current task was asked to stop and something it awaited
    swallowed the request (see above). No task here absorbs a cancel of its own on purpose."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def cancel_and_wait(task: asyncio.Future) -> None:
    """Cancels `task` and waits for it to end, absorbing its CancelledError but not the
    caller's: a cancellation requested of the calling task meanwhile is raised."""
    current = asyncio.current_task()
    requests_before = current.cancelling() if current is not None else 0
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if current is not None and current.cancelling() > requests_before:
            raise
