"""Stopping a helper task: its cancellation is absorbed, the stopper's own is not."""

from __future__ import annotations

import asyncio
import contextlib

from worker.cancelling import cancel_and_wait, raise_if_cancelled


async def slow_to_stop(stopped: list[str]) -> None:
    """A helper that needs a moment to clean up once cancelled (a last write, say)."""
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await asyncio.shield(asyncio.sleep(0.2))
        stopped.append("helper")
        raise


async def test_the_helpers_cancellation_is_absorbed():
    stopped: list[str] = []
    helper = asyncio.create_task(slow_to_stop(stopped))
    await asyncio.sleep(0)
    await cancel_and_wait(helper)
    assert helper.cancelled() and stopped == ["helper"]


async def test_a_stopper_cancelled_while_it_waits_is_cancelled_too():
    """With `suppress(CancelledError)` around the await, the stopper would carry on."""
    stopped: list[str] = []

    async def stopper():
        helper = asyncio.create_task(slow_to_stop(stopped))
        await asyncio.sleep(0)
        await cancel_and_wait(helper)
        stopped.append("stopper carried on")

    task = asyncio.create_task(stopper())
    await asyncio.sleep(0.05)  # the stopper now waits for its helper
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert "stopper carried on" not in stopped


async def test_cleanup_after_the_stoppers_own_cancellation_stops_every_helper():
    """A task cleaning up after it was cancelled (a worker's shutdown) is not cancelled again
    by its helpers' cancellations."""
    stopped: list[str] = []

    async def owner():
        helpers = [asyncio.create_task(slow_to_stop(stopped)) for _ in range(2)]
        try:
            await asyncio.sleep(3600)
        finally:
            for helper in helpers:
                await cancel_and_wait(helper)
            stopped.append("owner cleaned up")

    task = asyncio.create_task(owner())
    await asyncio.sleep(0.05)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert stopped == ["helper", "helper", "owner cleaned up"]


async def test_a_loop_stops_even_when_a_call_it_awaited_swallowed_its_cancel():
    """As `asyncio.wait_for` on Python 3.11 may (and redis-py writes through it): the call
    returns normally though the task was cancelled. The loop's next turn raises it."""
    turns: list[int] = []

    async def swallowing_call():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)

    async def process_long_loop():
        while True:
            raise_if_cancelled()
            turns.append(len(turns))
            await swallowing_call()

    task = asyncio.create_task(process_long_loop())
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.wait_for(asyncio.wait([task]), timeout=5)  # without the check: forever
    assert task.cancelled() and turns == [0]


async def test_a_task_never_cancelled_carries_on():
    raise_if_cancelled()
    assert not asyncio.current_task().cancelling()
