"""Error responses: JSON `{"error": ...}` under /api/, a small page for people elsewhere.

Nothing here touches the database or Redis: these pages are shown when either is down, and a
page that needed them (the site's base template asks for the user) would fail in turn.
"""

from __future__ import annotations

import logging
import sys

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from redis import exceptions as redis_errors

log = logging.getLogger("sluice.errors")

# Seconds a client is asked to wait after a 503: Redis or PostgreSQL restarting takes seconds.
RETRY_AFTER_SECONDS = 30

# Redis errors that mean "unreachable or not serving right now", not a bug in a command
# (a WRONGTYPE or a script error stays a 500 with its traceback in the log).
REDIS_OUTAGES = (
    redis_errors.ConnectionError,  # also BusyLoadingError, MaxConnectionsError
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
    redis_errors.MasterDownError,
)
# PoolTimeout (no free pooled connection in time) reaches Django as an OperationalError too.
DATABASE_OUTAGES = (OperationalError, InterfaceError)

OUTAGE_MESSAGES = {
    "database": "Sluice cannot reach its database right now. Please try again in a minute.",
    "redis": "Sluice cannot reach its queue right now. Please try again in a minute.",
}


def is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def is_openai_api(request: HttpRequest) -> bool:
    return request.path.startswith("/v1/")


def error_response(
    request: HttpRequest, status: int, title: str, message: str, *, retry_after: int | None = None
) -> HttpResponse:
    if is_openai_api(request):  # the shape OpenAI's clients parse
        kind = "server_error" if status >= 500 else "invalid_request_error"
        response: HttpResponse = JsonResponse(
            {"error": {"message": message, "type": kind, "param": None, "code": None}},
            status=status,
        )
    elif is_api(request):
        response = JsonResponse({"error": message}, status=status)
    else:
        page = render_to_string(
            "errors/page.html", {"status": status, "title": title, "message": message}
        )
        response = HttpResponse(page, status=status)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


def outage_of(exception: BaseException) -> str | None:
    """Which backing service `exception` says is unavailable, or None for any other error."""
    if isinstance(exception, REDIS_OUTAGES):
        return "redis"
    if isinstance(exception, DATABASE_OUTAGES):
        return "database"
    return None


def outage_response(request: HttpRequest, exception: BaseException) -> HttpResponse | None:
    """503 with Retry-After when `exception` is an outage of Redis or PostgreSQL, else None."""
    service = outage_of(exception)
    if service is None:
        return None
    log.warning(
        "%s %s: %s unavailable (%s: %s)",
        request.method,
        request.path,
        service,
        type(exception).__name__,
        exception,
    )
    return error_response(
        request,
        503,
        "Temporarily unavailable",
        OUTAGE_MESSAGES[service],
        retry_after=RETRY_AFTER_SECONDS,
    )


# -- handlers named in chatsite/urls.py ----------------------------------------------------------


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if isinstance(exception, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE / (1024 * 1024)
        message = f"The request body is too large (the limit is {limit:.1f} MB)."
        return error_response(request, 413, "Too large", message)
    return error_response(request, 400, "Bad request", "The request could not be understood.")


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return error_response(request, 403, "Forbidden", "You may not do that.")


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return error_response(request, 404, "Not found", "There is nothing here.")


def server_error(request: HttpRequest) -> HttpResponse:
    # Django calls this while it handles the exception, so it is still current: an outage
    # raised outside a view (by a middleware) is a 503 here too.
    response = outage_response(request, sys.exc_info()[1]) if sys.exc_info()[1] else None
    return response or error_response(
        request,
        500,
        "Something went wrong",
        "Something went wrong on our side. It has been logged; please try again.",
    )
