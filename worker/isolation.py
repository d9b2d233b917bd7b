"""Suspect work runs alone, so a crash is blamed on what caused it.

A request is *suspect* when its last attempt vanished: started, never finished and never handed
back (`transitions.vanished`), because its worker died or was paused past its claim. Anything
that ran beside it on that worker is suspect too, since nobody can tell which one killed it.

A worker runs one suspect at a time and nothing beside it: it stops taking work, waits for its
other answers to end, then starts the suspect. Only then is the attempt counted, so a crash while
it runs can only be its own, and work that kills every worker uses up its attempts on workers
where it ran alone, while an innocent neighbour is re-run once, alone, and finishes. A second
suspect that reaches a worker already holding one goes back to the shared stream, uncounted,
for another worker to isolate. What it costs: after a crash, each surviving suspect takes a
worker's slots to itself for one answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Isolation:
    def __init__(self) -> None:
        self._others = 0  # this worker's running tasks, the suspect's excepted
        self._suspects = 0
        self._others_ended = asyncio.Event()
        self._others_ended.set()
        self.clear = asyncio.Event()  # set while no suspect waits or runs: work may be taken
        self.clear.set()

    @property
    def holding_suspect(self) -> bool:
        return self._suspects > 0

    def task_started(self) -> None:
        self._others += 1
        self._others_ended.clear()

    def task_ended(self) -> None:
        self._others -= 1
        if self._others == 0:
            self._others_ended.set()

    @asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        """Holds the worker for one suspect task (started like any other): waits until every
        other task has ended, and no new work is taken until the suspect's attempt is over."""
        self._suspects += 1
        self.clear.clear()
        self.task_ended()  # the suspect itself is not among the others it waits for
        try:
            await self._others_ended.wait()
            yield
        finally:
            self.task_started()
            self._suspects -= 1
            if not self._suspects:
                self.clear.set()
