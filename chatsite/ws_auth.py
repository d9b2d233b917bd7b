"""The websocket's login: the user of the session cookie, read once when the socket opens.

Channels' AuthMiddlewareStack does the same, and also wraps the socket's `send` to save a
session that changed, on every frame the socket sends; a chat socket never changes its session,
so that wrapper is a cost on each of an answer's frames for nothing. The socket re-checks its
session itself (apps/accounts/sessions.py), so none is kept stale.

Channels reads the user in the one sync thread it shares with everything else in the process,
tidying that thread's database connections before and after: when a web process restarts and
every page reconnects at once, that is most of what a login costs. Logins run in a lane of the
database pool of their own instead (apps/chat/offload.py): one thread, as before, so that a
crowd of logins never takes the threads that store the questions of the chats already open.
"""

from __future__ import annotations

from importlib import import_module

from channels.auth import get_user
from django.conf import settings
from django.http.cookie import parse_cookie

from apps.chat.offload import LOGINS, db_call


class SessionAuthMiddleware:
    def __init__(self, inner) -> None:
        self.inner = inner

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or ())
        cookies = parse_cookie(headers.get(b"cookie", b"").decode("latin1"))
        store = import_module(settings.SESSION_ENGINE).SessionStore
        session = store(session_key=cookies.get(settings.SESSION_COOKIE_NAME))
        scope = {**scope, "cookies": cookies, "session": session}
        # Channels' lookup itself (the session, the user, the session's hash), in its lane.
        scope["user"] = await db_call(get_user.func, lane=LOGINS)(scope)  # AnonymousUser if none
        return await self.inner(scope, receive, send)
