"""Django middleware of the whole site."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.utils.deprecation import MiddlewareMixin

from core.errors import outage_response


class BackendOutageMiddleware(MiddlewareMixin):
    """A view (sync or async) that fails because Redis or PostgreSQL is unreachable answers 503
    with Retry-After and a clear message, not a 500 with a traceback: the one place that turns
    outages into answers, so no view has to catch them itself."""

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        return outage_response(request, exception)
