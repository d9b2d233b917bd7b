"""The OpenAI-compatible API: `POST /v1/chat/completions` (streamed or not), `GET /v1/models`,
`POST /v1/embeddings`. Any OpenAI client works against it with a Sluice API key.

A chat completion is stateless, as at OpenAI: the caller sends the whole conversation and
Sluice stores none. Otherwise it is an ordinary Sluice request (kind "api"): the plan's rates
and models, the fair queue and its positions, affinity-free routing to a worker of the model,
and Stop (a client that disconnects stops the answer and frees the engine's slot).

The views are async because they follow the answer through the process's output hub; database
and Redis commands run in the database pool's threads (`db_call`), never on the event loop.
docs/api.md lists what is and is not supported.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from redis.exceptions import RedisError

from apps.accounts.services import api_key_hash
from apps.admission import selectors as admission
from apps.admission.models import Plan
from apps.api import openai_errors as errors
from apps.api import openai_formats as formats
from apps.api import openai_shapes as shapes
from apps.api.openai_choices import choices_response
from apps.api.openai_embeddings import embeddings_create
from apps.api.openai_errors import ApiError
from apps.api.openai_limits import rate_limit_headers
from apps.api.openai_relay import (
    answer_followed,
    final_calls,
    final_logprobs,
    final_usage,
)
from apps.chat import services
from apps.chat.publish import request_publish
from apps.streams.hub_base import Entry
from apps.streams.offload import db_call
from contract import capabilities, protocol
from contract.protocol import WorkItem

log = logging.getLogger("sluice.chat.openai")

KIND = "api"  # the request type plans weigh (cost_weights), set here, never by the caller
RETRY_AFTER_SECONDS = 30


@dataclass
class Caller:
    user: object
    plan: Plan


def bearer(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    return header[7:].strip() if header[:7].lower() == "bearer " else None


def caller_for(raw_key: str | None) -> Caller:
    """The user behind the API key and their plan. In a pool thread."""
    found = admission.api_key_caller(raw=raw_key) if raw_key else None
    if found is None:
        raise errors.bad_key()
    return Caller(*found)


async def authenticated(request: HttpRequest) -> Caller:
    raw = bearer(request)
    if not raw:
        raise errors.bad_key()
    return await db_call(caller_for)(raw)


def api_view(view):
    """CSRF-exempt (API keys, no cookies); ApiError raised anywhere becomes its response."""

    async def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        try:
            return await view(request, *args, **kwargs)
        except ApiError as error:
            return error.response()
        except RedisError as exc:
            log.warning("%s: Redis unavailable: %s", request.path, exc)
            return ApiError(
                503,
                "Sluice cannot reach its queue right now. Please try again in a minute.",
                type="server_error",
                code="service_unavailable",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            ).response()

    return csrf_exempt(wrapped)


def method(request: HttpRequest, allowed: str) -> None:
    if request.method != allowed:
        raise ApiError(405, f"Use {allowed} for {request.path}.", code="method_not_allowed")


# -- chat completions -------------------------------------------------------------------------


@dataclass
class Started:
    request_ids: list[str]  # one per choice (openai_choices.py)
    model: str
    created: int
    first_events: list[Entry]  # each one's output stream's first entry, as published

    @property
    def request_id(self) -> str:
        return self.request_ids[0]

    @property
    def first_event(self) -> Entry:
        return self.first_events[0]


def start_completion(
    raw_key: str | None, body: bytes
) -> tuple[Caller, shapes.ChatRequest, Started]:
    """Authenticates, reads the request, picks the model and hands the request to admission,
    in one trip through the pool. Raises ApiError."""
    caller = caller_for(raw_key)  # a bad key is a 401 before anything else is looked at
    asked = shapes.chat_request(errors.body_of(body))
    return caller, asked, completion_submit(caller, asked, raw_key=raw_key)


def completion_submit(caller: Caller, asked: shapes.ChatRequest, *, raw_key: str | None) -> Started:
    """Picks the model, checks that its workers can serve what `asked` asks and that it fits
    the model's context, and hands it to admission (one request per choice). In a pool
    thread; raises ApiError. The Responses API submits through here too
    (responses_views.py)."""
    model = asked.model or admission.model_default(plan=caller.plan)
    status = admission.model_status(model=model, plan=caller.plan) if model else None
    if status == admission.MODEL_NOT_FOUND:
        raise errors.model_not_found(model)
    if status != admission.MODEL_OK:
        raise errors.no_worker(model or "(default)")
    needs = capabilities.asked(asked)
    if needs:  # only the models whose every worker can serve it
        missing = capabilities.first_missing(needs, admission.model_capabilities(model=model))
        if missing is not None:
            raise errors.not_on_model(model, *missing)
    prompt_tokens = asked.prompt_tokens_estimate
    room = errors.context_room(
        window=admission.model_context_tokens(model=model),
        prompt_tokens=prompt_tokens,
        asked=asked.max_tokens,
    )
    items = [
        choice_item(
            asked,
            index,
            user_id=str(caller.user.pk),
            max_tokens=min(asked.max_tokens or settings.MODEL_MAX_TOKENS, room),
            model=model,
            prompt_tokens=prompt_tokens,
        )
        for index in range(asked.n)
    ]
    # The key's hash goes with the request, so its usage is filed under the key (apps/usage).
    first_events = [
        request_publish(item=item, citations=[], api_key=api_key_hash(raw_key or ""))
        for item in items
    ]
    return Started([item.id for item in items], model, int(time.time()), first_events)


def choice_item(
    asked: shapes.ChatRequest,
    index: int,
    *,
    user_id: str,
    max_tokens: int,
    model: str,
    prompt_tokens: int,
) -> WorkItem:
    """The work item of choice `index`. With a seed, each choice draws from its own (the seed
    plus its index): choices of one seed would otherwise all be the same answer."""
    seed = asked.seed
    if seed is not None and index:
        seed = seed + index if seed + index <= formats.SEED_RANGE[1] else seed - index
    return WorkItem(
        id=protocol.new_request_id(),
        user_id=user_id,
        conversation_id="",
        messages=asked.messages,
        max_tokens=max_tokens,
        temperature=settings.MODEL_TEMPERATURE
        if asked.temperature is None
        else float(asked.temperature),
        prompt_tokens_estimate=prompt_tokens,
        kind=KIND,
        model=model,
        top_p=None if asked.top_p is None else float(asked.top_p),
        stop=asked.stop,
        response_format=asked.response_format,
        seed=seed,
        presence_penalty=asked.presence_penalty,
        frequency_penalty=asked.frequency_penalty,
        tools=asked.tools,
        tool_choice=asked.tool_choice,
        parallel_tool_calls=asked.parallel_tool_calls,
        logprobs=asked.logprobs,
        logit_bias=asked.logit_bias,
    )


def refusal(final: dict[str, str], caller: Caller, model: str, *, headers: bool = True) -> ApiError:
    """The error a request that ended without an answer is to its client. With `headers`, in
    a pool thread: a rate limit's headers read the user's buckets (an error inside a stream
    has no headers)."""
    code, message = final.get("code", ""), final.get("error") or "The request failed."
    retry_after = final.get("retry_after")
    if final.get("state") == protocol.State.CANCELLED:
        # The `openai` SDK retries a 409 unless told not to: a retry would undo the cancel.
        return ApiError(
            409,
            "The request was stopped before it finished.",
            code="request_cancelled",
            headers={"x-should-retry": "false"},
        )
    if code == "rate_limited":
        limits = rate_limit_headers(caller.user.pk, caller.plan) if headers else {}
        limits["Retry-After"] = retry_after or "1"
        kind = "requests" if limits.get("x-ratelimit-remaining-requests") == "0" else "tokens"
        return ApiError(429, message, type=kind, code="rate_limit_exceeded", headers=limits)
    if code == "too_large":
        return ApiError(400, message, param="max_tokens", code="request_too_large")
    if code == "model_not_allowed":
        return errors.model_not_found(model)
    if code == capabilities.REFUSED_CODE:  # the engine cannot serve what the request asks
        return ApiError(400, message, code="unsupported_parameter")
    if code in ("shed", "no_worker"):
        return ApiError(
            503,
            message,
            type="server_error",
            code="overloaded",
            headers={"Retry-After": retry_after or str(RETRY_AFTER_SECONDS)},
        )
    return ApiError(500, message, type="server_error", code="answer_failed")


@api_view
async def chat_completions(request: HttpRequest) -> HttpResponse:
    method(request, "POST")
    caller, asked, started = await db_call(start_completion)(bearer(request), request.body)
    request_id = started.request_id

    async def cancel_one(request_id: str) -> None:
        try:
            await db_call(services.request_cancel)(user=caller.user, request_id=request_id)
        except Exception as exc:  # the answer then runs to its end, and is settled as usual
            log.warning("could not stop request %s: %s", request_id, exc)

    async def cancel() -> None:
        await cancel_one(request_id)

    if asked.n > 1:
        return await choices_response(
            asked,
            started,
            cancel_one,
            error_of=lambda final, headers: refusal(final, caller, started.model, headers=headers),
        )

    chunks = None
    if asked.stream:
        chunks = shapes.Chunks(
            request_id=request_id,
            model=started.model,
            created=started.created,
            include_usage=asked.include_usage,
        )

    def whole(final: dict) -> dict:
        return shapes.completion(
            request_id=request_id,
            model=started.model,
            created=started.created,
            text=final.get("text", ""),
            finish_reason=final.get("finish_reason", ""),
            usage=final_usage(final),
            tool_calls=final_calls(final),
            logprobs=final_logprobs(final),
        )

    return await answer_followed(
        started.request_id,
        started.first_event,
        cancel,
        chunks=chunks,
        whole=whole,
        refuse=lambda final, headers=True: refusal(final, caller, started.model, headers=headers),
    )


# -- models and embeddings --------------------------------------------------------------------


def model_entry(name: str, seen_ms: int, served: frozenset[str]) -> dict:
    """OpenAI's model object, with what a request of the model may ask (`capabilities`: every
    one Sluice knows, true or false) beside it."""
    return {
        "id": name,
        "object": "model",
        "created": seen_ms // 1000,
        "owned_by": "sluice",
        "capabilities": capabilities.table(served),
    }


def listed_models(caller: Caller) -> dict[str, dict]:
    """The models live workers serve that the caller's plan allows, as /v1/models shows
    them."""
    fleet = admission.model_fleet()
    return {
        name: model_entry(name, fleet.known.get(name, 0), fleet.capabilities.get(name, frozenset()))
        for name in admission.models_for_plan(plan=caller.plan)
    }


@api_view
async def models_list(request: HttpRequest) -> HttpResponse:
    method(request, "GET")
    caller = await authenticated(request)
    listed = await db_call(listed_models)(caller)
    return JsonResponse({"object": "list", "data": list(listed.values())})


@api_view
async def model_detail(request: HttpRequest, model: str) -> HttpResponse:
    method(request, "GET")
    caller = await authenticated(request)
    listed = await db_call(listed_models)(caller)
    if model not in listed:
        raise errors.model_not_found(model)
    return JsonResponse(listed[model])


@api_view
async def embeddings(request: HttpRequest) -> HttpResponse:
    method(request, "POST")
    caller = await authenticated(request)
    body = errors.body_of(request.body)
    return JsonResponse(await embeddings_create(body, user=caller.user, plan=caller.plan))
