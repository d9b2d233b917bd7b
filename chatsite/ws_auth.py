"""The websocket's login: the user of the session cookie, read once when the socket opens.

Channels' AuthMiddlewareStack does the same, and also wraps the socket's `send` to save a
session that changed, on every frame the socket sends; a chat socket never changes its session,
so that wrapper is a cost on each of an answer's frames for nothing. The socket re-checks its
session itself (apps/accounts/sessions.py), so none is kept stale.
"""

from __future__ import annotations

from importlib import import_module

from channels.auth import get_user
from django.conf import settings
from django.http.cookie import parse_cookie


class SessionAuthMiddleware:
    def __init__(self, inner) -> None:
        self.inner = inner

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or ())
        cookies = parse_cookie(headers.get(b"cookie", b"").decode("latin1"))
        store = import_module(settings.SESSION_ENGINE).SessionStore
        session = store(session_key=cookies.get(settings.SESSION_COOKIE_NAME))
        scope = {**scope, "cookies": cookies, "session": session}
        scope["user"] = await get_user(scope)  # AnonymousUser without a valid session
        return await self.inner(scope, receive, send)
