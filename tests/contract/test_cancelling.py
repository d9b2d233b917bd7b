"""Stopping a helper task: its cancellation is absorbed, the stopper's own is not."""

from __future__ import annotations

import asyncio
import contextlib

from contract.cancelling import cancel_and_wait, raise_if_cancelled


class SlowToStop:
    """A helper that needs a moment to clean up once cancelled (a last write, say). Its events
    say when it waits to be cancelled and when it cleans up, so a test acts at those points."""

    def __init__(self, stopped: list[str]) -> None:
        self.stopped = stopped
        self.waiting = asyncio.Event()
        self.cleaning = asyncio.Event()

    async def run(self) -> None:
        try:
            self.waiting.set()
            await asyncio.Event().wait()  # until cancelled
        except asyncio.CancelledError:
            self.cleaning.set()
            await asyncio.shield(asyncio.sleep(0.2))  # the cleanup takes real time: waited for
            self.stopped.append("helper")
            raise


async def test_the_helpers_cancellation_is_absorbed():
    stopped: list[str] = []
    slow = SlowToStop(stopped)
    helper = asyncio.create_task(slow.run())
    await slow.waiting.wait()
    await cancel_and_wait(helper)
    assert helper.cancelled() and stopped == ["helper"]


async def test_a_stopper_cancelled_while_it_waits_is_cancelled_too():
    """With `suppress(CancelledError)` around the await, the stopper would carry on."""
    stopped: list[str] = []
    slow = SlowToStop(stopped)

    async def stopper():
        helper = asyncio.create_task(slow.run())
        await slow.waiting.wait()
        await cancel_and_wait(helper)
        stopped.append("stopper carried on")

    task = asyncio.create_task(stopper())
    await slow.cleaning.wait()  # the stopper now waits for its helper
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert "stopper carried on" not in stopped


async def test_cleanup_after_the_stoppers_own_cancellation_stops_every_helper():
    """A task cleaning up after it was cancelled (a worker's shutdown) is not cancelled again
    by its helpers' cancellations."""
    stopped: list[str] = []
    slow = [SlowToStop(stopped) for _ in range(2)]

    async def owner():
        helpers = [asyncio.create_task(s.run()) for s in slow]
        try:
            await asyncio.Event().wait()  # until cancelled
        finally:
            for helper in helpers:
                await cancel_and_wait(helper)
            stopped.append("owner cleaned up")

    task = asyncio.create_task(owner())
    for s in slow:  # the owner has started its helpers and waits
        await s.waiting.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert stopped == ["helper", "helper", "owner cleaned up"]


async def test_a_loop_stops_even_when_a_call_it_awaited_swallowed_its_cancel():
    """As `asyncio.wait_for` on Python 3.11 may (and redis-py writes through it): the call
    returns normally though the task was cancelled. The loop's next turn raises it."""
    turns: list[int] = []
    in_call = asyncio.Event()

    async def swallowing_call():
        with contextlib.suppress(asyncio.CancelledError):
            in_call.set()
            await asyncio.Event().wait()  # until cancelled

    async def process_long_loop():
        while True:
            raise_if_cancelled()
            turns.append(len(turns))
            await swallowing_call()

    task = asyncio.create_task(process_long_loop())
    await in_call.wait()
    task.cancel()
    await asyncio.wait_for(asyncio.wait([task]), timeout=5)  # without the check: forever
    assert task.cancelled() and turns == [0]


async def test_a_task_never_cancelled_carries_on():
    raise_if_cancelled()
    assert not asyncio.current_task().cancelling()
