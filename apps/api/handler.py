"""Django for the OpenAI-compatible API (`/v1/`), with only the middleware its requests need.

Under ASGI, Django runs each step of a classic middleware (`process_request`,
`process_response`) through `sync_to_async`: a thread hop each, for every request, even to an
async view. The site's pages need sessions, CSRF, messages and the rest; a request that carries
an API key needs none of them. So `/v1/` gets a handler of its own whose middleware runs on the
event loop: the security headers (pure header logic, called directly), the request counter,
and the outage answer. A page request still goes through the site's full chain.

Django also gives every ASGI request a thread-sensitive context of its own, so the request's
synchronous work runs on a thread made for it, and ended (by yet another thread) after it: two
threads started and stopped per request. An API request's only such work is Django's request
signals (the views are async, their database work goes to apps/streams/offload.py's pool), so API
requests share one long-lived thread for it instead. (Page requests keep a thread each, lent
from threads that earlier requests used: core/request_threads.py.)

Measured on and off (`bench/ab.py a57817b openai_overhead --pairs 2 -- --clients 100 --ramp 1`,
this handler and daphne's patches on, against a tree with both off): 0.95 -> 0.85 of the
upstream's answers/s, time to first token +56 -> +168 ms p50, CPU 12.8 -> 15.9 ms per answer
(+24 %), the same way in both pairs. Kept for that. It builds its middleware chain as Django
5.2's handler does (pyproject pins django to 5.2.x), from its own list, never from the site's
settings.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext
from django.core.exceptions import ImproperlyConfigured
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response
from django.middleware.security import SecurityMiddleware
from django.utils.module_loading import import_string

API_PREFIX = "/v1/"

API_MIDDLEWARE = [
    "apps.api.handler.DirectSecurityMiddleware",
    "apps.ops.middleware.RequestMetricsMiddleware",
    "core.middleware.BackendOutageMiddleware",
]


class DirectSecurityMiddleware(SecurityMiddleware):
    """Django's SecurityMiddleware (HTTPS redirect, HSTS, nosniff, referrer policy), its two
    steps called directly on the event loop: they only read settings and set headers."""

    async def __acall__(self, request):
        response = self.process_request(request)
        response = response or await self.get_response(request)
        return self.process_response(request, response)


class ApiHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()
        # One call at a time on one thread, as a thread-sensitive context requires.
        self.signals_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sluice-api")

    async def __call__(self, scope, receive, send):
        # Entered first, Django's own context inside it reuses this one's thread.
        async with ThreadSensitiveContext(executor=self.signals_thread):
            await super().__call__(scope, receive, send)

    def load_middleware(self, is_async: bool = False) -> None:
        """The API's chain, built from API_MIDDLEWARE as Django builds the site's from
        settings.MIDDLEWARE, leaving the settings alone. Each is async-capable and the handler
        is async, so nothing needs adapting; only `process_exception` hooks are kept aside
        (Django calls them itself, synchronously). ASGIHandler calls this once, at startup."""
        self._view_middleware, self._template_response_middleware = [], []
        self._exception_middleware = []
        handler = convert_exception_to_response(self._get_response_async)
        for path in reversed(API_MIDDLEWARE):
            middleware = import_string(path)
            if not getattr(middleware, "async_capable", False):
                raise ImproperlyConfigured(f"{path} must be async-capable to serve /v1/")
            instance = middleware(handler)
            if hasattr(instance, "process_view") or hasattr(instance, "process_template_response"):
                raise ImproperlyConfigured(f"{path}: /v1/ views get no view hooks")
            if hasattr(instance, "process_exception"):
                self._exception_middleware.append(
                    self.adapt_method_mode(False, instance.process_exception)
                )
            handler = convert_exception_to_response(instance)
        self._middleware_chain = handler


def route_api(site_app, api_app):
    """An ASGI app sending `/v1/` HTTP requests to `api_app` and the rest to `site_app`."""

    async def app(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(API_PREFIX):
            return await api_app(scope, receive, send)
        return await site_app(scope, receive, send)

    return app
