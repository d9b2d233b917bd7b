"""A chat completion's answer, followed on its output stream through the process's hub and told
to the client as OpenAI does: one `chat.completion`, or `chat.completion.chunk`s over SSE.

Admission is asynchronous (the dispatcher decides), so the view first waits for the event that
decides the request's fate: a refusal is then still a plain HTTP error (429, 4xx, 503), and
anything else is a 200. A streamed request waiting in line sends SSE comments with its position,
so proxies keep the connection and the caller can see where it stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable

from django.http import JsonResponse, StreamingHttpResponse

from apps.api.openai_errors import ApiError
from apps.api.openai_shapes import Chunks, queued_comment
from apps.streams.hub import get_hub
from apps.streams.hub_base import Entry
from apps.streams.offload import db_call
from contract.cancelling import cancel_and_wait
from contract.protocol import EventType, State
from core.redis_client import keys

# A streamed request not decided by then (the dispatcher is slow to say) starts its stream
# anyway; a refusal after that arrives in the stream as an error.
DECISION_WAIT_SECONDS = 10.0
# While nothing runs yet (waiting in line, held by the plan's rate), a comment this often keeps
# idle-timeout proxies from closing the stream.
KEEPALIVE_SECONDS = 15.0


class Follow:
    """One request's output events as the hub delivers them, in batches, readable with a
    timeout that leaves the reading intact (the next call continues where it stopped)."""

    def __init__(self, request_id: str, *, written: Entry | None = None) -> None:
        """`written`: the request's first event, as its caller published it (hub_base)."""
        self._batches = get_hub().batches(keys().output(request_id), after="0", written=written)
        self._next: asyncio.Future | None = None

    def upcoming(self) -> asyncio.Future:
        """The next batch, as a future to wait on beside other follows' (`next` then returns
        it once it is done)."""
        if self._next is None:
            self._next = asyncio.ensure_future(anext(self._batches))
        return self._next

    async def next(self, timeout: float | None = None) -> list[Entry] | None:
        """The next batch, or None when `timeout` passes first."""
        if self._next is None:
            if timeout is None:  # the common case costs no task
                return await anext(self._batches)
            self.upcoming()
        done, _ = await asyncio.wait((self._next,), timeout=timeout)
        if not done:
            return None
        task, self._next = self._next, None
        return task.result()

    async def close(self) -> None:
        if self._next is not None:
            with contextlib.suppress(Exception):  # the batch's own failure: nobody reads it
                await cancel_and_wait(self._next)
            self._next = None
        await self._batches.aclose()


def decisive(fields: dict[str, str]) -> bool:
    """Whether this event settles admission: queued with a position or dispatched (admitted),
    running, or ended."""
    kind = fields.get("type")
    if kind == EventType.STATUS:
        return "position" in fields or fields.get("state") == State.DISPATCHED
    return kind in (EventType.START, EventType.DELTA, EventType.FINAL)


async def await_decision(follow: Follow, *, wait: float | None) -> tuple[list[Entry], bool]:
    """The events up to and including the batch with the first decisive one, and whether it
    came (False: `wait` seconds passed first)."""
    seen: list[Entry] = []
    loop = asyncio.get_running_loop()
    deadline = None if wait is None else loop.time() + wait
    while True:
        left = None if deadline is None else max(0.0, deadline - loop.time())
        batch = await follow.next(timeout=left)
        if batch is None:
            return seen, False
        seen += batch
        if any(decisive(fields) for _, fields in batch):
            return seen, True


def final_of(entries: list[Entry]) -> dict[str, str] | None:
    return next((f for _, f in entries if f.get("type") == EventType.FINAL), None)


async def wait_final(follow: Follow, seen: list[Entry]) -> dict[str, str]:
    """The final event (for a completion returned whole)."""
    final = final_of(seen)
    while final is None:
        final = final_of(await follow.next())
    return final


def final_usage(final: dict[str, str]) -> dict:
    return json.loads(final.get("usage") or "{}")


def final_calls(final: dict[str, str]) -> list[dict]:
    """The tool calls the answer made (none in a final event of a release before tools)."""
    return json.loads(final.get("tool_calls") or "[]")


def final_logprobs(final: dict[str, str]) -> list[dict] | None:
    """Every token's log probability, when the request asked for them."""
    return json.loads(final["logprobs"]) if "logprobs" in final else None


class Diverged(Exception):
    """A re-run of the answer (its worker died) wrote other text than the client has."""


class StreamRelay:
    """Turns output events into SSE text: comments while in line, the role chunk when an
    attempt starts, one text chunk per batch of deltas, the finish (or an error) at the end.

    If the worker dies mid-answer another runs it again from the start: its text is matched
    against what the client already has and only what is new is sent; a re-run that writes
    other text ends the stream with an error (the text sent cannot be taken back)."""

    def __init__(
        self,
        chunks: Chunks,
        *,
        error_of: Callable[[dict], ApiError],
        index: int = 0,
        closes: bool = True,
    ) -> None:
        """`index`: the choice this answer is; `closes`: its end ends the stream (usage and
        [DONE]), which for one of several choices is openai_choices.py's to send."""
        self.chunks = chunks
        self.error_of = error_of
        self.index = index
        self.closes = closes
        self.usage: dict = {}  # the answer's, once it has ended
        self.failed = False  # it ended with an error, which ended the stream
        self.parts: list[str] = []  # the text sent
        self.replay: str | None = None  # a re-run's text still to match against `parts`
        self.replay_at = 0
        self.role_sent = False
        self.running = False  # an attempt has started: deltas follow without a long wait
        self.ended = False  # the client has its last chunk
        self.diverged = False

    def feed(self, batch: list[Entry]) -> str:
        out: list[str] = []
        text: list[str] = []
        # The log probabilities of `text`'s tokens, when the request asks for them (deltas of
        # a release before them, or of a request that does not ask, have none).
        scores: list[dict] | None = None
        for _, fields in batch:
            kind = fields.get("type")
            if kind == EventType.DELTA:
                try:
                    delta = fields.get("text", "")
                    new = self._new_text(delta)
                except Diverged:
                    self._flush(out, text, scores)
                    self.diverged = self.ended = self.failed = True
                    out.append(
                        self.chunks.error(
                            ApiError(
                                500,
                                "The worker running this answer stopped, and the answer it "
                                "restarted differs from the text already sent. Please retry.",
                                type="server_error",
                                code="answer_restarted",
                            )
                        )
                    )
                    return "".join(out)
                if new:
                    text.append(new)
                if "logprobs" in fields and new == delta:  # a re-run's repeat was sent before
                    scores = (scores or []) + json.loads(fields["logprobs"])
                continue
            self._flush(out, text, scores)
            scores = None
            if kind == EventType.STATUS and "position" in fields and not self.running:
                out.append(queued_comment(fields))
            elif kind == EventType.START:
                self.running = True
                if self.parts and int(fields.get("attempt") or 1) > 1:
                    self.replay, self.replay_at = "".join(self.parts), 0
                self._role(out)
            elif kind == EventType.FINAL:
                self._end(out, fields)
                break
        self._flush(out, text, scores)
        return "".join(out)

    def _role(self, out: list[str]) -> None:
        if not self.role_sent:
            self.role_sent = True
            out.append(self.chunks.role(self.index))

    def _flush(self, out: list[str], text: list[str], scores: list[dict] | None = None) -> None:
        if text or scores:
            self._role(out)
            out.append(self.chunks.text("".join(text), self.index, scores))
            text.clear()

    def _new_text(self, text: str) -> str:
        """The part of a delta the client does not have yet."""
        if self.replay is not None:
            overlap = min(len(text), len(self.replay) - self.replay_at)
            if text[:overlap] != self.replay[self.replay_at : self.replay_at + overlap]:
                raise Diverged
            self.replay_at += overlap
            if self.replay_at >= len(self.replay):
                self.replay = None
            text = text[overlap:]
        if text:
            self.parts.append(text)
        return text

    def _end(self, out: list[str], final: dict[str, str]) -> None:
        self.ended = True
        if final.get("state") != State.DONE:
            self.failed = True
            out.append(self.chunks.error(self.error_of(final)))
            return
        sent = "".join(self.parts)
        whole = final.get("text", "")
        if self.replay is None and whole.startswith(sent) and len(whole) > len(sent):
            self._role(out)  # text the deltas did not carry (trimmed): the final has it all
            out.append(self.chunks.text(whole[len(sent) :], self.index))
        self._role(out)
        calls = final_calls(final)
        if calls:  # whole, at the end: the worker sends a call only once it parses
            out.append(self.chunks.calls(calls, self.index))
        reason, self.usage = final.get("finish_reason") or "stop", final_usage(final)
        if self.closes:
            out.append(self.chunks.finish(reason, self.usage))
        else:
            out.append(self.chunks.choice_end(reason, self.index))


async def sse(
    follow: Follow, seen: list[Entry], relay: StreamRelay, cancel: Callable[[], Awaitable[None]]
) -> AsyncIterator[bytes]:
    """The response body of a streamed completion, as bytes (Django would look the charset up
    for every str chunk). However it stops (the client went away, the server is stopping), a
    request that has not ended is cancelled: its engine slot is freed at once."""
    try:
        out = relay.feed(seen)
        if out:
            yield out.encode()
        while not relay.ended:
            batch = await follow.next(timeout=None if relay.running else KEEPALIVE_SECONDS)
            if batch is None:
                yield b": keep-alive\n\n"
                continue
            out = relay.feed(batch)
            if out:
                yield out.encode()
    finally:
        await follow.close()
        if not relay.ended or relay.diverged:
            await asyncio.shield(cancel())


async def answer_followed(
    request_id: str,
    first_event: str,
    cancel: Callable[[], Awaitable[None]],
    *,
    chunks,
    whole: Callable[[dict], dict],
    refuse: Callable[..., ApiError],
):
    """A submitted request's answer, as the API client waits for it: streamed through
    `chunks` (the shape of chat completion chunks or of Responses events), or whole as
    `whole(final)` makes it when `chunks` is None. A refusal is `refuse(final)` (a database
    read, so off the event loop) raised; a client that goes away before the end stops the
    request (`cancel`). Chat completions and the Responses API
    both answer through here."""
    follow: Follow | None = Follow(request_id, written=first_event)
    ended = False  # its final event is here: nothing to stop
    try:
        wait = DECISION_WAIT_SECONDS if chunks is not None else None
        seen, _ = await await_decision(follow, wait=wait)
        final = final_of(seen)
        ended = final is not None
        if ended and final.get("state") != State.DONE:
            raise await db_call(refuse)(final)
        if chunks is not None:
            relay = StreamRelay(chunks, error_of=lambda f: refuse(f, headers=False))
            body, follow = sse(follow, seen, relay, cancel), None  # the body owns it from here
            response = StreamingHttpResponse(body, content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"  # tell nginx not to buffer the stream
            response["x-request-id"] = request_id
            return response
        final = await wait_final(follow, seen)
        ended = True
        if final.get("state") != State.DONE:
            raise await db_call(refuse)(final)
        response = JsonResponse(whole(final))
        response["x-request-id"] = request_id
        return response
    except ApiError as error:  # the request exists: the client can name it (`e.request_id`)
        error.headers.setdefault("x-request-id", request_id)
        raise
    finally:
        if follow is not None:
            await follow.close()
            if not ended:  # the client went away (or the server is stopping) while it ran
                await asyncio.shield(cancel())
