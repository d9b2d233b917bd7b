"""Redis commands of every running generation sent together: one pipeline per round trip.

A worker streaming a hundred answers sends a few thousand small commands a second (a delta
appended to an output stream, a cancel check). Sent one by one, each pays for a pool checkout,
a socket write and a read: the worker's CPU goes to Redis client overhead. Here each
generation still awaits its own command, so order within an answer is kept, but commands that
arrive while a pipeline is in flight wait for the next one and go in one write. With one answer
streaming that is one command per round trip, as before; with a hundred, a pipeline of a
hundred.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError

from contract.cancelling import cancel_and_wait, raise_if_cancelled
from worker.redis_connection import after_write

# Queues commands on the pipeline, e.g. `lambda p: p.get(key)`.
Queue = Callable[[Pipeline], Any]


class CommandBatcher:
    def __init__(self, client: aioredis.Redis, *, max_batch: int = 500) -> None:
        self.client = client
        self.max_batch = max_batch
        # Each caller's commands, its future, and what to call once they are sent (or None).
        self._pending: list[tuple[Queue, asyncio.Future, Callable[[], Any] | None]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def call(self, queue: Queue, *, sent: Callable[[], Any] | None = None) -> Any:
        """Runs the commands `queue` puts on a pipeline, in order; returns the reply (a list of
        replies when it queued several) or raises the first error. `sent` is called once the
        pipeline that carries them has been written to the connection, before its reply: what
        must not happen before Redis has the commands can wait for that, not for the reply.
        Only over connections that report their writes (redis_connection.py); elsewhere it is
        never called."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append((queue, future, sent))
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="redis-batcher")
        return await future

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        for _, future, _ in self._pending:
            if not future.done():
                future.set_exception(RedisConnectionError("the worker's Redis batcher closed"))
        self._pending.clear()

    async def _run(self) -> None:
        while True:
            raise_if_cancelled()  # one a write of its swallowed (cancelling.py)
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch = self._pending[: self.max_batch]
                del self._pending[: self.max_batch]
                await self._send(batch)

    async def _send(
        self, batch: list[tuple[Queue, asyncio.Future, Callable[[], Any] | None]]
    ) -> None:
        pipe = self.client.pipeline(transaction=False)
        spans: list[tuple[asyncio.Future, int, int]] = []  # each caller's slice of the replies
        written: list[Callable[[], Any]] = []
        for queue, future, sent in batch:
            start = len(pipe.command_stack)
            try:
                queue(pipe)
            except Exception as exc:  # a bad argument fails its caller, not the batch
                del pipe.command_stack[start:]
                future.set_exception(exc)
                continue
            spans.append((future, start, len(pipe.command_stack)))
            if sent is not None:
                written.append(sent)
        try:
            with after_write(written):
                replies = await pipe.execute(raise_on_error=False) if pipe.command_stack else []
        except Exception as exc:  # the connection failed: every command in it failed
            for future, _, _ in spans:
                if not future.done():
                    future.set_exception(exc)
            return
        for future, start, end in spans:
            if future.done():  # its generation was cancelled meanwhile
                continue
            mine = replies[start:end]
            error = next((r for r in mine if isinstance(r, Exception)), None)
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(mine[0] if len(mine) == 1 else mine)
