"""The websocket's login: the user of the session cookie, read once when the socket opens.

Channels' AuthMiddlewareStack does the same, and also wraps the socket's `send` to save a
session that changed, on every frame the socket sends; a chat socket never changes its session,
so that wrapper is a cost on each of an answer's frames for nothing. The socket re-checks its
session itself (apps/accounts/sessions.py), so none is kept stale.

Channels reads the user in its one shared sync thread, tidying that thread's connections before
and after; when a web process restarts, every open page reconnects at once, and each socket's
login then waited in that one line. It runs on the database pool's threads instead (the
consumers' own, apps/chat/offload.py), as the consumers' frames do.
"""

from __future__ import annotations

from importlib import import_module

from channels.auth import get_user
from django.conf import settings
from django.http.cookie import parse_cookie

from apps.chat.offload import db_call


class SessionAuthMiddleware:
    def __init__(self, inner) -> None:
        self.inner = inner

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or ())
        cookies = parse_cookie(headers.get(b"cookie", b"").decode("latin1"))
        store = import_module(settings.SESSION_ENGINE).SessionStore
        session = store(session_key=cookies.get(settings.SESSION_COOKIE_NAME))
        scope = {**scope, "cookies": cookies, "session": session}
        # Channels' lookup itself (the session, the user, the session's hash), on the pool.
        scope["user"] = await db_call(get_user.func)(scope)  # AnonymousUser if none is valid
        return await self.inner(scope, receive, send)
