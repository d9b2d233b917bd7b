"""The websocket's login: the user of the session cookie, read once when the socket opens.

Channels' AuthMiddlewareStack does the same, and also wraps the socket's `send` to save a
session that changed, on every frame the socket sends; a chat socket never changes its session,
so that wrapper is a cost on each of an answer's frames for nothing. The socket re-checks its
session itself (apps/accounts/sessions.py), so none is kept stale.

The login itself is apps/accounts/socket_login.py: two plain statements, leaving the socket's
session check passed (`scope["login"]`). Channels would read the user in the one sync thread
it shares with everything else in the process, tidying that thread's database connections
before and after: when a web process restarts and every page reconnects at once, that is most
of what a login costs. Logins run in a lane of the database pool of their own instead
(apps/streams/offload.py): one thread, so that a crowd of logins never takes the threads that
store the questions of the chats already open.

Measured on and off (bench/ab.py, the reconnect bench: 300 pages' two sockets opened at once;
"before" is the release whose logins, frames and closes ran through Channels' own helpers):
`bench/ab.py 2285c36 reconnect --pairs 2 -- --pages 300 --rounds 2`: all open in 4044 -> 3477
ms, handshake p50 3130 -> 2036 ms, web CPU 5.83 -> 5.22 ms per socket (-10 %), lower in every
pair; with the plain-statement login, `bench/ab.py 6ae5ffb reconnect --pairs 2 -- --pages 300
--rounds 2`: 6.81 -> 5.12 ms per socket, 12 -> 0 sockets dropped. Kept for that; it relies on
Channels 4.3's consumer and middleware behaviour (pyproject pins channels to 4.3.x).
"""

from __future__ import annotations

from importlib import import_module

from django.conf import settings
from django.http.cookie import parse_cookie

from apps.accounts.socket_login import socket_login
from apps.streams.offload import LOGINS, db_call


class SessionAuthMiddleware:
    def __init__(self, inner) -> None:
        self.inner = inner

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or ())
        cookies = parse_cookie(headers.get(b"cookie", b"").decode("latin1"))
        session_key = cookies.get(settings.SESSION_COOKIE_NAME)
        login = await db_call(socket_login, lane=LOGINS)(session_key)
        store = import_module(settings.SESSION_ENGINE).SessionStore
        scope = {
            **scope,
            "cookies": cookies,
            "session": store(session_key=session_key),
            "user": login.user,
            "login": login,
        }
        return await self.inner(scope, receive, send)
