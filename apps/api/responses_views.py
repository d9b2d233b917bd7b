"""The Responses API: `POST /v1/responses`, whole or streamed, on the chat completions path.

A Responses request is read into the chat completion it amounts to (responses_request.py) and
submitted by the same `openai_views.completion_submit`: the same plan, rates, queue, capability
checks, limits and usage rows. Its answer is followed on its output stream as a chat
completion's is (openai_relay.py) and told to the client as a `response` object or its stream
of events (responses_shapes.py). Errors name the Responses parameter (`input`, `text.format`,
`max_output_tokens`), not the chat completion's it became.

Stateless: nothing is stored, so `GET /v1/responses/{id}` is always a 404 that says so.
"""

from __future__ import annotations

import asyncio
import logging

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from apps.api import openai_errors as errors
from apps.api import openai_shapes as shapes
from apps.api.openai_errors import ApiError
from apps.api.openai_relay import (
    DECISION_WAIT_SECONDS,
    Follow,
    StreamRelay,
    await_decision,
    final_calls,
    final_of,
    final_usage,
    sse,
    wait_final,
)
from apps.api.openai_views import (
    Caller,
    Started,
    api_view,
    authenticated,
    bearer,
    caller_for,
    completion_submit,
    method,
    refusal,
)
from apps.api.responses_request import Echo, renamed, responses_request
from apps.api.responses_shapes import ResponseEvents, completed
from apps.chat import services
from apps.streams.offload import db_call
from worker import protocol

log = logging.getLogger("sluice.chat.openai")


def start_response(
    raw_key: str | None, body: bytes
) -> tuple[Caller, shapes.ChatRequest, Echo, Started]:
    """Authenticates, reads the request and hands it to admission, in one trip through the
    pool. Raises ApiError."""
    caller = caller_for(raw_key)  # a bad key is a 401 before anything else is looked at
    asked, echo = responses_request(errors.body_of(body))
    return caller, asked, echo, completion_submit(caller, asked, raw_key=raw_key)


@api_view
async def responses_create(request: HttpRequest) -> HttpResponse:
    method(request, "POST")
    try:
        return await _respond(request)
    except ApiError as error:
        raise renamed(error) from None


async def _respond(request: HttpRequest) -> HttpResponse:
    caller, asked, echo, started = await db_call(start_response)(bearer(request), request.body)
    request_id, model = started.request_id, started.model

    async def cancel() -> None:
        try:
            await db_call(services.request_cancel)(user=caller.user, request_id=request_id)
        except Exception as exc:  # the answer then runs to its end, and is settled as usual
            log.warning("could not stop request %s: %s", request_id, exc)

    follow: Follow | None = Follow(request_id, written=started.first_event)
    ended = False  # its final event is here: nothing to stop
    try:
        seen, _ = await await_decision(follow, wait=DECISION_WAIT_SECONDS if asked.stream else None)
        final = final_of(seen)
        ended = final is not None
        if ended and final.get("state") != protocol.State.DONE:
            raise await db_call(refusal)(final, caller, model)
        if asked.stream:
            events = ResponseEvents(
                request_id=request_id, model=model, created=started.created, echo=echo
            )
            relay = StreamRelay(events, error_of=lambda f: refusal(f, caller, model, headers=False))
            body, follow = sse(follow, seen, relay, cancel), None  # the body owns it from here
            response = StreamingHttpResponse(body, content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"  # tell nginx not to buffer the stream
            response["x-request-id"] = request_id
            return response
        final = await wait_final(follow, seen)
        ended = True
        if final.get("state") != protocol.State.DONE:
            raise await db_call(refusal)(final, caller, model)
        response = JsonResponse(
            completed(
                request_id=request_id,
                model=model,
                created=started.created,
                echo=echo,
                text=final.get("text", ""),
                calls=final_calls(final),
                finish_reason=final.get("finish_reason", ""),
                usage=final_usage(final),
            )
        )
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


@api_view
async def response_detail(request: HttpRequest, response_id: str) -> HttpResponse:
    """`GET` (or `DELETE`) of a response by id: nothing is stored, so nothing is found, for
    anyone (a bad key is a 401 first)."""
    await authenticated(request)
    raise ApiError(
        404,
        f"No response with id '{response_id}' found: Sluice stores no responses (`store` is "
        "always false). Keep what you need from the response you received.",
        param="response_id",
        code="response_not_found",
    )
