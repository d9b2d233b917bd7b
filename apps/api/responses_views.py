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

import logging

from django.http import HttpRequest, HttpResponse

from apps.api import openai_errors as errors
from apps.api import openai_shapes as shapes
from apps.api.openai_errors import ApiError
from apps.api.openai_relay import (
    answer_followed,
    final_calls,
    final_usage,
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

    events = None
    if asked.stream:
        events = ResponseEvents(
            request_id=request_id, model=model, created=started.created, echo=echo
        )

    def whole(final: dict) -> dict:
        return completed(
            request_id=request_id,
            model=model,
            created=started.created,
            echo=echo,
            text=final.get("text", ""),
            calls=final_calls(final),
            finish_reason=final.get("finish_reason", ""),
            usage=final_usage(final),
        )

    return await answer_followed(
        request_id,
        started.first_event,
        cancel,
        chunks=events,
        whole=whole,
        refuse=lambda final, headers=True: refusal(final, caller, model, headers=headers),
    )


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
