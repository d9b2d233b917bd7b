"""A websocket's handshake is answered within a bound, whatever Redis or PostgreSQL do.

A socket's opening reads Redis (the account events' last id in the login, the conversation's
answer in progress) and PostgreSQL (the session, the user, the conversation). Each read is
bounded by its client's timeout, but they add up: with Redis frozen, the login and the consumer
each wait REDIS_SOCKET_TIMEOUT. daphne does not wait that long: a handshake the application has
not answered within its own limit (`--websocket_connect_timeout`, 5 s) is dropped with no HTTP
response at all, and a page cannot tell that from a crashed server.

So a handshake not settled (accepted or refused) within HANDSHAKE_SECONDS is answered here:
accepted, told why in one frame, and closed with 4503, "try again later". That is the meaning of
the standard 1013, but autobahn (under daphne) lets an application close only with 1000 or
3000-4999, and Sluice's own codes already follow HTTP's (4401, 4403, 4404). The frame carries
the reason because daphne does not pass a close reason on to the client; the close message
names it too, for servers that do. The page shows it and tries again with backoff
(static/js/chat.js, static/js/inbox.js), for 1013 as for 4503. An HTTP 503 before the upgrade
would need the ASGI "websocket.http.response" extension, which daphne does not offer, and a
page never sees a refused handshake's status anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import orjson

log = logging.getLogger("sluice.streams.handshake")

# Under daphne's 5 s, with room for its once-a-second timeout check and the frames to go out.
HANDSHAKE_SECONDS = 4.0
TRY_AGAIN_LATER = 4503
CLOSE = {"type": "websocket.close", "code": TRY_AGAIN_LATER, "reason": "Try again later"}
UNAVAILABLE_MESSAGE = "Sluice cannot reach its database or queue right now."


class HandshakeDeadline:
    """ASGI middleware for websockets: answers a handshake the application has not settled
    within `seconds` with an {"type": "unavailable", "message": ...} frame and TRY_AGAIN_LATER."""

    def __init__(self, inner, *, seconds: float = HANDSHAKE_SECONDS) -> None:
        self.inner = inner
        self.seconds = seconds

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            return await self.inner(scope, receive, send)
        settled = asyncio.Event()
        answered_here = False

        async def guarded_send(message: dict) -> None:
            if answered_here:
                return  # a consumer that finished opening late: its socket is closed already
            if message["type"] in ("websocket.accept", "websocket.close"):
                settled.set()
            await send(message)

        app = asyncio.ensure_future(self.inner(scope, receive, guarded_send))
        waiter = asyncio.ensure_future(settled.wait())
        try:
            await asyncio.wait(
                {app, waiter}, timeout=self.seconds, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:  # daphne gave up on this socket (the client went away)
            app.cancel()
            raise
        finally:
            waiter.cancel()
        if settled.is_set() or app.done():
            return await app
        answered_here = True
        log.warning(
            "websocket %s not opened within %.1f s; closed with %d (try again later)",
            scope.get("path"),
            self.seconds,
            TRY_AGAIN_LATER,
        )
        await send({"type": "websocket.accept"})
        frame = {"type": "unavailable", "message": UNAVAILABLE_MESSAGE}
        await send({"type": "websocket.send", "text": orjson.dumps(frame).decode()})
        await send(CLOSE)
        app.cancel()
        # Its pool call, if one is running, ends within its client's timeout; nothing it does
        # reaches the socket any more.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await app
