"""A chat completion with `n` > 1: each choice is a request of its own, and the answers are
told to the client as one completion, choices indexed 0 to n-1.

Running the choices as separate requests serves `n` on every engine that samples, through the
same admission as any request: each choice is charged and capped by the plan like a request
of its own (a plan that allows fewer requests at once than `n` refuses the rest, as it would
refuse separate calls), and the usage the client sees is the choices' added up. A choice the
service refuses or fails fails the whole completion, and the choices still running are
stopped. Streamed, the choices' chunks interleave as their tokens come, each chunk naming its
choice's index; the stream ends once, with the summed usage (when asked for) and one [DONE].
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from django.http import HttpResponse, JsonResponse, StreamingHttpResponse

from apps.api import openai_shapes as shapes
from apps.api.openai_errors import ApiError
from apps.api.openai_relay import (
    DECISION_WAIT_SECONDS,
    KEEPALIVE_SECONDS,
    Follow,
    StreamRelay,
    await_decision,
    final_calls,
    final_logprobs,
    final_of,
    final_usage,
    wait_final,
)
from apps.streams.offload import db_call
from contract.protocol import State

Cancel = Callable[[str], Awaitable[None]]
# The error a choice that ended without an answer is to the client; with headers (a rate
# limit's, read from the database), or without them inside a stream.
ErrorOf = Callable[[dict, bool], ApiError]


def usage_sum(usages: list[dict]) -> dict:
    """The usage of several answers, as one."""
    return {
        name: sum(int(usage.get(name) or 0) for usage in usages)
        for name in ("prompt_tokens", "completion_tokens")
    }


async def sse_choices(
    follows: dict[str, Follow],
    seen: dict[str, list],
    relays: dict[str, StreamRelay],
    cancel: Cancel,
) -> AsyncIterator[bytes]:
    """The response body of a streamed completion of several choices (by request id: its
    follow, the events already read, its relay). However it stops, every choice that has not
    ended is stopped."""
    chunks = next(iter(relays.values())).chunks
    failed = False
    try:
        for request_id, relay in relays.items():
            out = relay.feed(seen[request_id])
            failed = failed or relay.failed
            if out:
                yield out.encode()
            if failed:
                return
        while not all(relay.ended for relay in relays.values()):
            live = {
                rid: follows[rid].upcoming() for rid, relay in relays.items() if not relay.ended
            }
            running = any(relays[rid].running for rid in live)
            done, _ = await asyncio.wait(
                live.values(),
                timeout=None if running else KEEPALIVE_SECONDS,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not done:
                yield b": keep-alive\n\n"
                continue
            for request_id, upcoming in live.items():
                if upcoming not in done:
                    continue
                relay = relays[request_id]
                out = relay.feed(await follows[request_id].next(timeout=0))
                if out:
                    yield out.encode()
                if relay.failed:  # its error ended the stream
                    failed = True
                    return
        yield chunks.end(usage_sum([relay.usage for relay in relays.values()])).encode()
    finally:
        for follow in follows.values():
            await follow.close()
        for request_id, relay in relays.items():
            if not relay.ended or relay.diverged:
                await asyncio.shield(cancel(request_id))


async def choices_response(
    asked: shapes.ChatRequest, started: Any, cancel: Cancel, *, error_of: ErrorOf
) -> HttpResponse:
    """The completion of several choices (`started`: openai_views.Started), whole or
    streamed."""
    follows = {
        request_id: Follow(request_id, written=event)
        for request_id, event in zip(started.request_ids, started.first_events, strict=True)
    }
    ended: set[str] = set()
    handed = False  # the stream's body owns the follows
    try:
        seen: dict[str, list] = {}
        for request_id, follow in follows.items():
            wait = DECISION_WAIT_SECONDS if asked.stream else None
            seen[request_id], _ = await await_decision(follow, wait=wait)
            final = final_of(seen[request_id])
            if final is not None:
                ended.add(request_id)
                if final.get("state") != State.DONE:
                    raise await db_call(error_of)(final, True)
        if asked.stream:
            chunks = shapes.Chunks(
                request_id=started.request_id,
                model=started.model,
                created=started.created,
                include_usage=asked.include_usage,
            )
            relays = {
                request_id: StreamRelay(
                    chunks, error_of=lambda f: error_of(f, False), index=index, closes=False
                )
                for index, request_id in enumerate(follows)
            }
            body = sse_choices(follows, seen, relays, cancel)
            handed = True
            response = StreamingHttpResponse(body, content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"  # tell nginx not to buffer the stream
        else:
            finals = []
            for request_id, follow in follows.items():
                final = await wait_final(follow, seen[request_id])
                ended.add(request_id)
                if final.get("state") != State.DONE:
                    raise await db_call(error_of)(final, True)
                finals.append(final)
            response = JsonResponse(
                shapes.completion(
                    request_id=started.request_id,
                    model=started.model,
                    created=started.created,
                    usage=usage_sum([final_usage(final) for final in finals]),
                    choices=[
                        shapes.choice(
                            index=index,
                            text=final.get("text", ""),
                            finish_reason=final.get("finish_reason", ""),
                            tool_calls=final_calls(final),
                            logprobs=final_logprobs(final),
                        )
                        for index, final in enumerate(finals)
                    ],
                )
            )
        response["x-request-id"] = started.request_id
        return response
    except ApiError as error:  # the requests exist: the client can name the first
        error.headers.setdefault("x-request-id", started.request_id)
        raise
    finally:
        if not handed:
            for request_id, follow in follows.items():
                await follow.close()
                if request_id not in ended:  # the client went away, or a choice was refused
                    await asyncio.shield(cancel(request_id))
