"""The answers' output streams, written on one clock for every running generation.

Each generation appends its tokens to an `Answer` without waiting on Redis. Every
`interval` seconds one task appends each answer's gathered text to its output stream, all in
one pipeline; every `cancel_interval` seconds it also asks, in one pipeline, which running
answers were stopped. The first token of an answer is written at once (time to first token
is what a user waits on), and the end of an answer is written by its own generation after the
text still gathered, through the same ordered batcher, so a reader never sees a final event
before the last delta.

One clock instead of one timer per answer keeps the worker's per-token work to a list append,
and lets a web process read a tick's entries for all its open chats in one XREAD.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from . import protocol
from .batching import CommandBatcher
from .protocol import Keys

log = logging.getLogger("sluice.worker")


class Answer:
    """One generation's output: the text not yet written, and whether a Stop was seen."""

    __slots__ = ("cancelled", "out_key", "pending", "pending_chars", "request_id", "started")

    def __init__(self, request_id: str, out_key: str) -> None:
        self.request_id = request_id
        self.out_key = out_key
        self.pending: list[str] = []
        self.pending_chars = 0
        self.started = False  # its first delta is written
        self.cancelled = False

    def take(self) -> str:
        text = "".join(self.pending)
        self.pending.clear()
        self.pending_chars = 0
        return text


class OutputWriter:
    """Writes the deltas of every running answer on a shared clock.

    Args:
        batcher: the worker's ordered Redis command batcher.
        keys: stream and key names.
        interval: seconds between writes of gathered text (an answer gets at most about one
            output-stream entry per interval).
        max_chars: an answer holding this much unwritten text is written at once, without
            waiting for the clock (a fast model's long bursts).
        cancel_interval: seconds between checks for Stop; a Stop lands within about this long.
    """

    def __init__(
        self,
        batcher: CommandBatcher,
        keys: Keys,
        *,
        interval: float = 0.03,
        max_chars: int = 64,
        cancel_interval: float = 0.2,
    ) -> None:
        self.batcher = batcher
        self.keys = keys
        self.interval = interval
        self.max_chars = max_chars
        self.cancel_interval = cancel_interval
        self.answers: dict[str, Answer] = {}
        self._task: asyncio.Task | None = None
        self._last_cancel_check = 0.0

    def open(self, request_id: str) -> Answer:
        answer = Answer(request_id, self.keys.output(request_id))
        self.answers[request_id] = answer
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="output-writer")
        return answer

    async def add(self, answer: Answer, text: str) -> None:
        """Gathers `text`; writes it now only when it is the answer's first or the gathered
        text is long. Otherwise returns without touching Redis."""
        answer.pending.append(text)
        answer.pending_chars += len(text)
        if not answer.started or answer.pending_chars >= self.max_chars:
            answer.started = True
            await self.flush(answer)

    async def flush(self, answer: Answer) -> None:
        """Writes the answer's gathered text, if any, before anything it queues afterwards."""
        if answer.pending:
            event = protocol.delta_event(answer.take())
            await self.batcher.call(lambda p: queue_emit(p, answer.out_key, event))

    async def close(self, answer: Answer) -> None:
        """Writes what is left of the answer and stops writing for it."""
        self.answers.pop(answer.request_id, None)
        await self.flush(answer)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while self.answers:
            await asyncio.sleep(self.interval)
            try:
                await self.tick()
            except Exception as exc:  # Redis trouble: this tick's deltas are lost, but each
                # answer's final event still carries its whole text, so no reader loses any.
                log.warning("writing answers failed: %s", exc)

    async def tick(self) -> None:
        """One clock tick: every answer's gathered text in one pipeline, and the Stop check
        when it is due."""
        due: list[tuple[Answer, dict[str, str]]] = [
            (answer, protocol.delta_event(answer.take()))
            for answer in self.answers.values()
            if answer.pending and answer.started
        ]
        now = time.monotonic()
        check = now - self._last_cancel_check >= self.cancel_interval
        watched = [a for a in self.answers.values() if not a.cancelled] if check else []
        if not due and not watched:
            return
        if check:
            self._last_cancel_check = now

        def queue(pipe) -> None:
            for answer, event in due:
                queue_emit(pipe, answer.out_key, event)
            for answer in watched:
                pipe.exists(self.keys.cancel(answer.request_id))

        replies = await self.batcher.call(queue)
        if not isinstance(replies, list):
            replies = [replies]
        for answer, stopped in zip(watched, replies[len(due) :], strict=True):
            if stopped:
                answer.cancelled = True


def queue_emit(pipe, out_key: str, event: dict[str, str]) -> None:
    """Appends to a request's output stream, capped. Its expiry is set when an attempt starts
    and again with the final event, not on every delta: one command per batch, not two."""
    pipe.xadd(out_key, event, maxlen=protocol.OUTPUT_MAXLEN, approximate=True)
