"""The answers' output streams, written on one clock for every running attempt.

Each attempt appends its tokens to an `OutputBuffer` without waiting on Redis. Every `interval`
seconds one task appends each buffer's gathered text to its output stream, all in one
pipeline; every `check_interval` seconds it also asks, in the same pipeline, which attempts
were stopped (the cancel flag) or replaced (another attempt owns the request). The first token
of an answer is written at once (time to first token is what a user waits on), and the end of
an answer is written by its own attempt after the text still gathered, through the same ordered
batcher, so a reader never sees a final event before the last delta.

Writes go through `transitions.delta`, fenced by the attempt's token and numbered, so text
that could not be written (Redis restarting) is kept and sent again, and is written once.

One clock instead of one timer per answer keeps the worker's per-token work to a list append,
and lets a web process read a tick's entries for all its open chats in one XREAD.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from redis.exceptions import RedisError

from contract import transitions
from contract.cancelling import cancel_and_wait
from contract.protocol import Keys
from worker.batching import CommandBatcher

log = logging.getLogger("sluice.worker")


class OutputBuffer:
    """One attempt's output: the text not yet written, and whether it was stopped or lost."""

    __slots__ = (
        "batches",
        "cancelled",
        "logprobs",
        "lost",
        "pending",
        "pending_chars",
        "request_id",
        "started",
        "token",
    )

    def __init__(self, request_id: str, token: str) -> None:
        self.request_id = request_id
        self.token = token  # the attempt's fencing token (transitions.start)
        self.pending: list[str] = []
        self.pending_chars = 0
        # The pending text's log probabilities, when the request asks for them (None: not).
        self.logprobs: list[dict] | None = None
        self.batches = 0  # batches taken for writing, numbered from 1
        self.started = False  # its first delta is written
        self.cancelled = False  # the user pressed Stop
        self.lost = False  # another attempt owns the request now

    @property
    def over(self) -> bool:
        """Nothing more of this attempt should be generated."""
        return self.cancelled or self.lost

    def take(self) -> tuple[int, str, list[dict] | None]:
        text = "".join(self.pending)
        self.pending.clear()
        self.pending_chars = 0
        self.batches += 1
        logprobs = self.logprobs
        if logprobs is not None:
            self.logprobs = []
        return self.batches, text, logprobs

    def put_back(self, batch: int, text: str, logprobs: list[dict] | None = None) -> None:
        """A batch that could not be written goes back in front of what arrived since; it keeps
        its number only if nothing was taken after it."""
        self.pending.insert(0, text)
        self.pending_chars += len(text)
        if logprobs is not None:
            self.logprobs = logprobs + (self.logprobs or [])
        if self.batches == batch:
            self.batches -= 1


class OutputWriter:
    """Writes the deltas of every running attempt on a shared clock.

    Args:
        batcher: the worker's ordered Redis command batcher.
        keys: stream and key names.
        interval: seconds between writes of gathered text (an answer gets at most about one
            output-stream entry per interval) while few answers run.
        busy_interval: ... the same with `busy_answers` or more running: in between, the
            interval grows in step with the answers running. Each entry is a frame that Redis,
            the web process and the browser handle, so under load fewer, larger frames keep
            the CPU per answer down; with few answers running the text flows finer.
        max_chars: an answer holding this much unwritten text is written at once, without
            waiting for the clock (a fast model's long bursts).
        check_interval: seconds between checks for Stop and for a lost claim; a Stop lands
            within about this long.
    """

    def __init__(
        self,
        batcher: CommandBatcher,
        keys: Keys,
        *,
        interval: float = 0.03,
        busy_interval: float | None = None,
        busy_answers: int = 64,
        max_chars: int = 64,
        check_interval: float = 0.2,
    ) -> None:
        self.batcher = batcher
        self.keys = keys
        self.interval = interval
        self.busy_interval = max(interval, busy_interval if busy_interval is not None else interval)
        self.busy_answers = max(2, busy_answers)
        self.max_chars = max_chars
        self.check_interval = check_interval
        self.buffers: dict[str, OutputBuffer] = {}
        self._task: asyncio.Task | None = None
        self._last_check = 0.0

    def open(self, request_id: str, token: str) -> OutputBuffer:
        buffer = OutputBuffer(request_id, token)
        self.buffers[request_id] = buffer
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="output-writer")
        return buffer

    async def add(
        self, buffer: OutputBuffer, text: str, logprobs: list[dict] | None = None
    ) -> None:
        """Gathers `text` (and its tokens' `logprobs`, when asked for); writes it now only when
        it is the answer's first or the gathered text is long. Otherwise returns without
        touching Redis."""
        buffer.pending.append(text)
        buffer.pending_chars += len(text)
        if logprobs is not None:
            buffer.logprobs = (buffer.logprobs or []) + logprobs
        if not buffer.started or buffer.pending_chars >= self.max_chars:
            buffer.started = True
            with contextlib.suppress(RedisError):  # kept; the clock sends it again
                await self.flush(buffer)

    async def flush(self, buffer: OutputBuffer) -> None:
        """Writes the buffer's gathered text, if any, before anything queued afterwards. Raises
        RedisError with the text kept for the next try."""
        if not buffer.pending or buffer.lost:
            return
        batch, text, logprobs = buffer.take()
        try:
            written = await self.batcher.call(
                lambda p: self._queue_delta(p, buffer, batch, text, logprobs)
            )
        except RedisError:
            buffer.put_back(batch, text, logprobs)
            raise
        self._written(buffer, written)

    @staticmethod
    def _written(buffer: OutputBuffer, reply) -> None:
        """What a delta's reply says about its attempt: still on, stopped, or replaced."""
        if reply == transitions.NOT_OWNER:
            buffer.lost = True
        elif reply == transitions.WRITTEN_STOPPED:
            buffer.cancelled = True

    def interval_now(self) -> float:
        """The clock's period for the answers running now."""
        running = len(self.buffers)
        if running <= 1:
            return self.interval
        share = min(1.0, (running - 1) / (self.busy_answers - 1))
        return self.interval + (self.busy_interval - self.interval) * share

    async def close(self, buffer: OutputBuffer) -> None:
        """Stops writing for the buffer; what is left is written by `flush` before the end."""
        self.buffers.pop(buffer.request_id, None)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _run(self) -> None:
        while self.buffers:
            await asyncio.sleep(self.interval_now())
            try:
                await self.tick()
            except RedisError as exc:  # the text is kept: the next tick sends it again
                log.warning("writing answers failed: %s", exc)

    def _queue_delta(
        self, pipe, buffer: OutputBuffer, batch: int, text: str, logprobs: list[dict] | None
    ) -> None:
        transitions.delta(
            pipe,
            self.keys,
            buffer.request_id,
            token=buffer.token,
            text=text,
            batch=batch,
            logprobs=logprobs,
        )

    async def tick(self) -> None:
        """One clock tick: every buffer's gathered text in one pipeline, and the checks for
        Stop and for a lost claim when they are due (a delta's reply answers both for its
        answer, so only the answers with nothing to write this tick are asked)."""
        due = [
            (buffer, *buffer.take())
            for buffer in self.buffers.values()
            if buffer.pending and buffer.started and not buffer.lost
        ]
        now = time.monotonic()
        check = now - self._last_check >= self.check_interval
        writing = {id(buffer) for buffer, *_ in due}
        watched = (
            [b for b in self.buffers.values() if not b.over and id(b) not in writing]
            if check
            else []
        )
        if not due and not watched:
            return
        if check:
            self._last_check = now

        def queue(pipe) -> None:
            for buffer, batch, text, logprobs in due:
                self._queue_delta(pipe, buffer, batch, text, logprobs)
            for buffer in watched:
                pipe.exists(self.keys.cancel(buffer.request_id))
                pipe.hget(self.keys.request(buffer.request_id), "owner")

        try:
            replies = await self.batcher.call(queue)
        except RedisError:
            for buffer, batch, text, logprobs in reversed(due):
                buffer.put_back(batch, text, logprobs)
            raise
        if not isinstance(replies, list):
            replies = [replies]
        for (buffer, *_), written in zip(due, replies, strict=False):
            self._written(buffer, written)
        checks = replies[len(due) :]
        for buffer, stopped, owner in zip(watched, checks[0::2], checks[1::2], strict=True):
            buffer.cancelled = buffer.cancelled or bool(stopped)
            if owner != buffer.token:
                buffer.lost = True
