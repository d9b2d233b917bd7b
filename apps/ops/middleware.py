"""Counts every HTTP request of a web process for `/metrics`, and has the log lines written
while a request about one answer is served (the API's `/requests/<id>`, the inspector) carry
that request id."""

from __future__ import annotations

import re
import time

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from apps.ops.metrics import HTTP_REQUESTS, HTTP_SECONDS
from contract.logs import request_id_var

REQUEST_PATH = re.compile(r"/requests?/([0-9a-f]{32})(?:/|$)")


class RequestMetricsMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    # The request id is set for the whole of the request's handling, Django's own log line
    # for a 4xx or 5xx included (written after the middleware has returned); each request
    # starts by setting it, so none inherits another's.
    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        started = time.perf_counter()
        _mark(request)
        response = self.get_response(request)
        _count(request, response, started)
        return response

    async def _acall(self, request):
        started = time.perf_counter()
        _mark(request)
        response = await self.get_response(request)
        _count(request, response, started)
        return response


def _mark(request) -> None:
    found = REQUEST_PATH.search(request.path)
    request_id_var.set(found.group(1) if found else "")


def _count(request, response, started: float) -> None:
    method = (
        request.method if request.method in ("GET", "POST", "HEAD", "PUT", "DELETE") else "other"
    )
    HTTP_REQUESTS.labels(method, str(response.status_code)).inc()
    HTTP_SECONDS.observe(time.perf_counter() - started)
