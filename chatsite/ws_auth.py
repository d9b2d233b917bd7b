"""The websocket's login: the user of the session cookie, read once when the socket opens.

Channels' AuthMiddlewareStack does the same, and also wraps the socket's `send` to save a
session that changed, on every frame the socket sends; a chat socket never changes its session,
so that wrapper is a cost on each of an answer's frames for nothing. The socket re-checks its
session itself (apps/accounts/sessions.py), so none is kept stale.

Channels' `get_user` also runs on asgiref's one shared thread, borrowing a database connection
from the pool and tidying it in two more hops between threads; here the same lookup runs in the
websockets' own pool (apps/chat/offload.py), whose threads keep their connections: a page that
opens its sockets, or a hundred that reconnect at once, wait on one queue of eight threads
rather than on one thread.
"""

from __future__ import annotations

from importlib import import_module

from channels.auth import get_user
from django.conf import settings
from django.http.cookie import parse_cookie

from apps.chat.offload import db_call

# channels.auth.get_user's own function (it is wrapped for the shared thread), in the pool.
_user_of_scope = db_call(get_user.func)


class SessionAuthMiddleware:
    def __init__(self, inner) -> None:
        self.inner = inner

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or ())
        cookies = parse_cookie(headers.get(b"cookie", b"").decode("latin1"))
        store = import_module(settings.SESSION_ENGINE).SessionStore
        session = store(session_key=cookies.get(settings.SESSION_COOKIE_NAME))
        scope = {**scope, "cookies": cookies, "session": session}
        scope["user"] = await _user_of_scope(scope)  # AnonymousUser without a valid session
        return await self.inner(scope, receive, send)
