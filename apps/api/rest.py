"""The API for scripts: submit a request (202 Accepted), then follow it as Server-Sent Events.

Auth: a session cookie (with CSRF, as for any form) or `Authorization: Bearer <API key>`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
from asgiref.sync import sync_to_async
from django.core.exceptions import ValidationError
from django.db import close_old_connections
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    JsonResponse,
    StreamingHttpResponse,
)
from django.middleware.csrf import CsrfViewMiddleware
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from apps.accounts.services import api_key_authenticate, api_key_hash
from apps.admission import selectors as admission_selectors
from apps.api.stream_session import StreamLogin, until_login_ends
from apps.chat import selectors, services, submission
from apps.streams.frames import EVENT_ID, frame_for_event
from apps.streams.hub import get_hub
from core.redis_client import keys


def _error(status: int, message: str, **extra) -> JsonResponse:
    return JsonResponse({"error": message, **extra}, status=status)


def _unauthenticated() -> JsonResponse:
    return _error(401, "Authentication required: a session or an API key.")


def _bearer(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    return header[7:].strip() if header.startswith("Bearer ") else None


def authenticate(request: HttpRequest):
    """The user behind an API key or a session (CSRF-checked for unsafe methods); or None."""
    raw = _bearer(request)
    if raw is not None:
        return api_key_authenticate(raw=raw)
    if request.user.is_authenticated:
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            reject = CsrfViewMiddleware(lambda r: None).process_view(request, None, (), {})
            if reject is not None:
                return None
        return request.user
    return None


@csrf_exempt  # API keys need no CSRF token; session callers are checked in authenticate()
@require_POST
def request_create(request: HttpRequest) -> JsonResponse:
    user = authenticate(request)
    if user is None:
        return _unauthenticated()
    try:
        body = orjson.loads(request.body or b"{}")  # strict: see openai_errors.body_of
    except orjson.JSONDecodeError as exc:
        return _error(400, f"The body must be a JSON object: {exc}.")
    if not isinstance(body, dict):
        return _error(400, "The body must be a JSON object.")
    text = body.get("text")
    if not isinstance(text, str):
        return _error(400, "Field 'text' (a string) is required.")
    try:
        text = services.clean_message_text(text)
    except ValidationError as exc:
        return _error(400, " ".join(exc.messages))
    conversation_id = body.get("conversation")
    if conversation_id is not None and not isinstance(conversation_id, int):
        return _error(400, "Field 'conversation' must be an integer id.")
    model = body.get("model")
    if model is not None:
        refusal = _model_refusal(user, model)
        if refusal is not None:
            return refusal
        model = model.strip()
    if conversation_id is None:
        conversation = services.conversation_create(owner=user)
    else:
        conversation = selectors.conversation_get_for_user(user=user, id=conversation_id)
    raw_key = _bearer(request)
    question = submission.Question(
        user=user,
        conversation=conversation,
        text=text,
        model=model,
        new=conversation_id is None,  # the tabs' sidebars add it
        # Its usage is filed under the key as well as the user, as on the OpenAI API.
        api_key=api_key_hash(raw_key) if raw_key else "",
    )
    try:
        submitted = submission.request_submit(question)
    except submission.REFUSALS as exc:
        refusal = submission.refusal_of(exc)
        response = _error(refusal.status, refusal.message)
        if refusal.retry_after:
            response["Retry-After"] = str(refusal.retry_after)
        return response
    events_url = reverse("api:request_events", args=[submitted.request_id])
    accepted = {
        "request_id": submitted.request_id,
        "conversation": submitted.conversation_id,
        "state": "queued",
        "events_url": events_url,
    }
    if submitted.notice:  # the answer goes on without the documents' passages
        accepted["notice"] = submitted.notice
    response = JsonResponse(accepted, status=202)
    response["Location"] = events_url
    return response


def _model_refusal(user, model) -> JsonResponse | None:
    """Why `model` cannot answer this user now (404: no such model for them; 503: no worker
    serves it right now), or None."""
    if not isinstance(model, str) or not model.strip():
        return _error(400, "Field 'model' must be a model name (GET /v1/models lists them).")
    plan = admission_selectors.plan_for_user(user=user)
    status = admission_selectors.model_status(model=model.strip(), plan=plan)
    if status == admission_selectors.MODEL_NOT_FOUND:
        return _error(404, f"No model {model!r} is available to you.")
    if status == admission_selectors.MODEL_NO_WORKER:
        response = _error(503, f"No worker serves the model {model!r} right now.")
        response["Retry-After"] = "30"
        return response
    return None


@require_GET
def request_detail(request: HttpRequest, request_id: str) -> JsonResponse:
    user = authenticate(request)
    if user is None:
        return _unauthenticated()
    info = selectors.request_get_for_user(user=user, request_id=request_id)
    detail = {"request_id": info.id, "conversation": info.conversation_id, "state": info.state}
    if info.notice:
        detail["notice"] = info.notice
    return JsonResponse(detail)


@csrf_exempt
@require_POST
def request_cancel(request: HttpRequest, request_id: str) -> JsonResponse:
    user = authenticate(request)
    if user is None:
        return _unauthenticated()
    info = services.request_cancel(user=user, request_id=request_id)
    return JsonResponse({"request_id": info.id, "cancelling": True}, status=202)


def _stream_login(request: HttpRequest, request_id: str) -> StreamLogin | None:
    """The login that may follow `request_id` (None: unauthenticated; Http404: not theirs).
    The database connection goes back to the pool at once: the stream that follows may last
    minutes, and holding a connection for each open stream would empty the pool."""
    try:
        user = authenticate(request)
        if user is None:
            return None
        selectors.request_get_for_user(user=user, request_id=request_id)
        raw_key = _bearer(request)
        session = getattr(request, "session", None)
        return StreamLogin(
            user_id=user.pk,
            raw_key=raw_key,
            session_key=None if raw_key is not None else getattr(session, "session_key", None),
        )
    finally:
        close_old_connections()


async def request_events(request: HttpRequest, request_id: str) -> HttpResponse:
    """Server-Sent Events; reconnecting clients send Last-Event-ID and continue from there."""
    if request.method != "GET":
        return _error(405, "Use GET.")
    try:
        login = await sync_to_async(_stream_login)(request, request_id)
    except Http404:
        return _error(404, "No such request.")
    if login is None:
        return _unauthenticated()
    after = request.headers.get("Last-Event-ID") or request.GET.get("last_event_id") or "0"
    if not EVENT_ID.fullmatch(after):
        return _error(400, "Last-Event-ID must be an event id such as 1700000000000-0.")
    stream = keys().output(request_id)

    async def events() -> AsyncIterator[bytes]:  # bytes: Django need not encode each one
        yield b"retry: 2000\n\n"
        async for entry_id, fields in get_hub().events(stream, after=after):
            frame = frame_for_event(request_id, entry_id, fields)
            if frame:
                head = f"id: {entry_id}\nevent: {frame['type']}\ndata: ".encode()
                yield head + orjson.dumps(frame) + b"\n\n"

    # Closed, like a websocket, when the login that opened it ends (stream_session.py).
    body = until_login_ends(login, events())
    response = StreamingHttpResponse(body, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # tell nginx not to buffer the stream
    return response
