"""Running one work item: claim the request for a new attempt, generate the answer, end the
request, acknowledge the work item.

Every Redis write here goes through `transitions` and is retried while Redis is away (a
restart, a failover), so an attempt never leaves its answer half-written: it is finished, or it
learns that another attempt owns the request and stops without writing anything more. The
work item is acknowledged only after the request has ended; a worker that dies before that
leaves it pending, and a live worker runs it again as the next attempt.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from contract import transitions
from contract.capabilities import REFUSED_CODE, EngineRefused
from contract.protocol import Answer, Keys, State, WorkItem
from worker import metrics
from worker.ahead import EngineAhead
from worker.batching import CommandBatcher
from worker.engines import Engine, EngineRequest
from worker.heartbeat import WorkerStats
from worker.isolation import Isolation
from worker.loops import LoopDetector
from worker.output import OutputBuffer, OutputWriter

log = logging.getLogger("sluice.worker")

# Redis errors worth waiting out: the server restarting, loading its data, or briefly away.
TRANSIENT = (RedisConnectionError, RedisTimeoutError)
# Tokens gathered before the loop detector reads them (it needs dozens of words to call a loop).
LOOP_CHECK_TOKENS = 8


@dataclass
class Attempts:
    """What running an attempt needs from its worker.

    Args:
        max_attempts: a request that failed this many attempts is not run again: it goes to
            the dead-letter stream and fails visibly (it may be what kills its workers).
        answer_timeout: seconds an answer may take; a hung engine fails the answer and frees
            its slot instead of holding it forever.
        redis_patience: seconds a write waits out Redis being away before giving up.
        stop_loops: cut an answer that repeats itself (finish reason `loop`); off unless the
            operator turned it on for this worker's model (worker/__main__.py's stop_loops).
    """

    batcher: CommandBatcher
    keys: Keys
    engine: Engine
    output: OutputWriter
    worker_id: str
    stats: WorkerStats
    max_attempts: int = 3
    answer_timeout: float = 600.0
    redis_patience: float = 300.0
    stop_loops: bool = False
    isolation: Isolation = field(default_factory=Isolation)

    async def write(
        self, queue: Callable[[Any], Any], *, sent: Callable[[], Any] | None = None
    ) -> Any:
        """Runs the commands `queue` puts on a pipeline, retried while Redis is away (`sent`:
        CommandBatcher.call's)."""
        return await self.retrying(lambda: self.batcher.call(queue, sent=sent))

    async def retrying(self, call: Callable[[], Awaitable[Any]]) -> Any:
        deadline = time.monotonic() + self.redis_patience
        delay = 0.2
        while True:
            try:
                return await call()
            except TRANSIENT as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("Redis unavailable (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def run(
        self, entry_id: str, fields: dict[str, str], stream: str, *, fresh: bool = False
    ) -> None:
        """Runs one work item to its end. If the worker stops it past its grace period
        (cancelled), the work item goes back to the shared stream for another worker.
        `fresh`: the item's first delivery, whose generation begins beside its claim
        (ahead.py)."""
        token = f"{self.worker_id}/{uuid.uuid4().hex[:12]}"
        finished = False
        try:
            if not fresh and await self._suspect(fields):
                if self.isolation.holding_suspect:  # one at a time: another worker takes it
                    log.warning("request %s is suspect; handed on to be run alone", fields["id"])
                    await self._give_back(entry_id, fields, stream, token)
                    return
                log.warning("request %s is suspect; running it alone", fields["id"])
                async with self.isolation.alone():
                    finished = await self._run(entry_id, fields, stream, fresh, token)
            else:
                finished = await self._run(entry_id, fields, stream, fresh, token)
        except asyncio.CancelledError:
            if not finished:
                await self._give_back(entry_id, fields, stream, token)
            raise

    async def _suspect(self, fields: dict[str, str]) -> bool:
        """Whether the request's last attempt vanished with its worker (isolation.py)."""
        if not fields.get("id"):
            return False  # malformed: _run dead-letters it
        reply = await self.write(lambda p: transitions.vanished(p, self.keys, fields["id"]))
        return bool(reply)

    async def _run(
        self, entry_id: str, fields: dict[str, str], stream: str, fresh: bool, token: str
    ) -> bool:
        try:
            item = WorkItem.from_fields(fields)
        except (KeyError, ValueError, TypeError) as exc:
            reason = f"malformed work item: {exc.__class__.__name__}: {exc}"
            log.error("dead-lettering work item %s: %s", entry_id, reason)
            await self.write(
                lambda p: (
                    transitions.dead_letter(
                        p,
                        self.keys,
                        source="worker",
                        stream=stream,
                        entry_id=entry_id,
                        fields=fields,
                        reason=reason,
                    ),
                    transitions.work_done(p, stream, entry_id),
                )
            )
            return True
        begun: list[EngineAhead] = []

        def claim_sent() -> None:
            # The claim has been written: a request that kills the worker now has its attempt
            # counted, so a fresh item's engine may start before the claim's reply.
            if fresh and not begun:
                begun.append(EngineAhead(self.engine, _request_of(item)))

        try:
            start = transitions.start_result(
                await self.write(
                    lambda p: transitions.start(
                        p,
                        self.keys,
                        item.id,
                        token=token,
                        worker_id=self.worker_id,
                        max_attempts=self.max_attempts,
                        prompt_tokens=item.prompt_tokens_estimate,
                    ),
                    sent=claim_sent,
                )
            )
            ahead = begun[0] if begun else None
            if start.code != transitions.STARTED and ahead is not None:
                await ahead.drop()
            return await self._claimed(item, start, token, stream, entry_id, fields, ahead)
        finally:
            if begun and not begun[0].taken:  # the attempt ended before its answer
                await begun[0].drop()

    async def _claimed(
        self,
        item: WorkItem,
        start: transitions.Start,
        token: str,
        stream: str,
        entry_id: str,
        fields: dict[str, str],
        ahead: EngineAhead | None,
    ) -> bool:
        if start.code == transitions.START_ENDED:  # ended meanwhile (stopped, or run already)
            await self.write(lambda p: transitions.work_done(p, stream, entry_id))
            return True
        answer = Answer(
            id=item.id,
            user_id=item.user_id,
            conversation_id=item.conversation_id,
            state=State.DONE,
            worker_id=self.worker_id,
            attempt=start.attempt,
            prompt_tokens_estimate=item.prompt_tokens_estimate,
            max_tokens=item.max_tokens,
            model=item.model,
            logprobs=None if item.logprobs is None else [],
        )
        exhausted = start.code == transitions.START_EXHAUSTED
        metrics.started(item.id, attempt=start.attempt, worker_id=self.worker_id)
        if start.code == transitions.START_STOPPED:
            answer.state = State.CANCELLED
        elif exhausted:
            log.error("request %s failed %d times; dead-lettered", item.id, start.charged - 1)
            answer.state = State.FAILED
            answer.error = (
                "This answer could not be generated: it was tried "
                f"{start.charged - 1} times and failed each time. Please try again "
                "or rephrase the question."
            )
        else:
            buffer = await self._generate(item, answer, token, ahead)
            if buffer.lost:
                log.warning(
                    "request %s: attempt %d lost its claim to a newer one; stopped",
                    item.id,
                    start.attempt,
                )
                return True  # the current attempt acknowledges the work item
        dead_letter = f"started {start.charged - 1} times without finishing" if exhausted else ""
        return await self._end(answer, token, stream, entry_id, fields, dead_letter=dead_letter)

    async def _generate(
        self, item: WorkItem, answer: Answer, token: str, ahead: EngineAhead | None
    ) -> OutputBuffer:
        buffer = self.output.open(item.id, token)
        if ahead is not None:
            started, outputs = ahead.started, ahead.outputs()
        else:
            started, outputs = time.perf_counter(), self.engine.generate(_request_of(item))
        parts: list[str] = []
        loops = LoopDetector() if self.stop_loops else None
        unchecked: list[str] = []  # text the loop detector has not read yet
        checked_tokens = 0  # the tokens it had read at its last look
        usage = answer.usage
        try:
            async with asyncio.timeout(self.answer_timeout):
                async for output in outputs:
                    usage.prompt_tokens = output.prompt_tokens
                    usage.cached_tokens = output.cached_tokens
                    usage.completion_tokens = output.completion_tokens
                    if output.finish_reason in ("stop", "length", "tool_calls"):
                        answer.finish_reason = output.finish_reason
                    if output.tool_calls:  # whole, at the end; they reach readers in the final
                        answer.tool_calls = output.tool_calls
                    if output.logprobs and answer.logprobs is not None:
                        answer.logprobs.extend(output.logprobs)
                        if not output.text:  # tokens whose text came earlier, or none
                            await self.output.add(buffer, "", output.logprobs)
                    if output.text:
                        if usage.ttft_ms is None:
                            usage.ttft_ms = round((time.perf_counter() - started) * 1000, 2)
                            metrics.first_token(item.id, usage.ttft_ms)
                        parts.append(output.text)
                        # The first token is written at once, the rest on the writer's clock.
                        await self.output.add(buffer, output.text, output.logprobs)
                        if loops is not None:
                            # Read in pieces of a few tokens: a loop spans dozens of words,
                            # and one look per piece costs a fraction of one per token. (An
                            # output may hold several tokens: an engine that reads in batches.)
                            unchecked.append(output.text)
                            if usage.completion_tokens - checked_tokens >= LOOP_CHECK_TOKENS:
                                looping = loops.feed("".join(unchecked))
                                unchecked.clear()
                                checked_tokens = usage.completion_tokens
                                if looping:  # repeating itself: stopped, and said so
                                    await self.engine.abort(item.id)
                                    answer.finish_reason = "loop"
                                    break
                    if buffer.over:  # Stop, or another attempt took over
                        await self.engine.abort(item.id)
                        break
        except TimeoutError:
            await self.engine.abort(item.id)
            answer.state = State.FAILED
            answer.error = (
                f"The model took longer than {self.answer_timeout:.0f} s to answer, "
                "so the answer was stopped. Please try again."
            )
        except asyncio.CancelledError:
            await self.engine.abort(item.id)
            await self.output.close(buffer)
            raise
        except EngineRefused as exc:  # asked what it cannot do (a schema it cannot enforce)
            log.warning("request %s refused: %s", item.id, exc)
            answer.state = State.FAILED
            answer.error = f"This model cannot answer it: {exc}."
            answer.code = REFUSED_CODE
        except Exception as exc:  # an engine failure fails this answer, not the worker
            log.exception("request %s failed in the engine", item.id)
            answer.state = State.FAILED
            answer.error = f"The model failed: {exc.__class__.__name__}"
        if not buffer.lost:
            await self.retrying(lambda: self.output.flush(buffer))
        await self.output.close(buffer)
        if buffer.cancelled and answer.state == State.DONE:
            answer.state = State.CANCELLED
        answer.text = "".join(parts)
        usage.duration_ms = round((time.perf_counter() - started) * 1000, 2)
        self.stats.add_tokens(usage.completion_tokens)
        return buffer

    async def _end(
        self,
        answer: Answer,
        token: str,
        stream: str,
        entry_id: str,
        fields: dict[str, str],
        *,
        dead_letter: str,
    ) -> bool:
        """Ends the request, then records the answer and acknowledges the work item. The work
        item stays pending if another attempt owns the request: that one acknowledges it."""
        result = transitions.finish_result(
            await self.write(lambda p: transitions.finish(p, self.keys, answer, token=token))
        )
        if result == transitions.LOST:
            log.warning(
                "request %s: attempt %d lost its claim before it ended", answer.id, answer.attempt
            )
            return True
        # A request its engine refused is the request's fault, not the worker's.
        failed = answer.state == State.FAILED and answer.code != REFUSED_CODE
        self.stats.ended(answer.id, failed=failed)
        metrics.ended(answer)

        def after(pipe) -> None:
            if result == transitions.ENDED_NOW:
                transitions.answer_record(pipe, self.keys, answer)
            if dead_letter:
                transitions.dead_letter(
                    pipe,
                    self.keys,
                    source="worker",
                    stream=stream,
                    entry_id=entry_id,
                    fields=fields,
                    reason=dead_letter,
                )
            transitions.work_done(pipe, stream, entry_id)

        await self.write(after)
        return True

    async def _give_back(
        self, entry_id: str, fields: dict[str, str], stream: str, token: str
    ) -> None:
        """Back to the shared stream; an attempt this task began is released, not charged."""

        def queue(pipe) -> None:
            if fields.get("id"):
                transitions.released(pipe, self.keys, fields["id"], token=token)
            transitions.work_returned(pipe, self.keys, stream, entry_id, fields)

        try:
            async with asyncio.timeout(5):
                await self.batcher.call(queue)
            log.info("returned %s to the shared stream for another worker", fields.get("id"))
        except (TimeoutError, *TRANSIENT) as exc:  # left pending: a live worker reclaims it
            log.warning("could not return %s (%s); it will be reclaimed", fields.get("id"), exc)


def _request_of(item: WorkItem) -> EngineRequest:
    return EngineRequest(
        id=item.id,
        messages=item.messages,
        max_tokens=item.max_tokens,
        temperature=item.temperature,
        top_p=item.top_p,
        stop=item.stop,
        response_format=item.response_format,
        seed=item.seed,
        presence_penalty=item.presence_penalty,
        frequency_penalty=item.frequency_penalty,
        tools=item.tools,
        tool_choice=item.tool_choice,
        parallel_tool_calls=item.parallel_tool_calls,
        logprobs=item.logprobs,
        logit_bias=item.logit_bias,
    )
