"""The loop watch names the task that keeps an event loop from closing."""

from __future__ import annotations

import asyncio

from tests import loop_watch


def test_a_stalled_close_reports_the_task_and_what_it_awaits(monkeypatch, capsys):
    monkeypatch.setattr(loop_watch, "STALL_SECONDS", 0.2)
    release = None
    waiting = asyncio.Event()  # bound to the loop that first waits on it

    async def stubborn():
        """Swallows its first cancel and then waits on, as a careless `finally` would."""
        nonlocal release
        try:
            waiting.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            release = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_later(0.6, release.set_result, None)
            await release

    async def main():
        asyncio.get_running_loop().create_task(stubborn(), name="stubborn")
        await waiting.wait()  # it runs: the loop's close has it to cancel

    asyncio.run(main())  # closes once the stubborn task's wait ends, 0.6 s after its cancel
    report = capsys.readouterr().err
    assert "event loop close stalled" in report
    assert "name='stubborn'" in report
    assert "in stubborn" in report  # its frame, where it waits
    assert "awaits <Future pending" in report
