"""The base of Sluice's websocket consumers: their database work goes through the pool.

Measured on and off (bench/ab.py, the reconnect bench: 300 pages' two sockets opened at once;
"before" is the release whose logins, frames and closes ran through Channels' own helpers):
`bench/ab.py 2285c36 reconnect --pairs 2 -- --pages 300 --rounds 2`: all open in 4044 -> 3477
ms, handshake p50 3130 -> 2036 ms, web CPU 5.83 -> 5.22 ms per socket (-10 %), lower in every
pair; with the plain-statement login, `bench/ab.py 6ae5ffb reconnect --pairs 2 -- --pages 300
--rounds 2`: 6.81 -> 5.12 ms per socket, 12 -> 0 sockets dropped. Kept for that; it relies on
Channels 4.3's consumer and middleware behaviour (pyproject pins channels to 4.3.x).
"""

from __future__ import annotations

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer


class PooledConsumer(AsyncWebsocketConsumer):
    """A websocket consumer whose database work all goes through `db_call`.

    Channels tidies the database connections of its one shared sync thread before every
    message a consumer handles (a socket's connect, each frame) and once more after a socket
    closes: a hop through that one thread each time, which every socket of the process waits in
    line for when pages reconnect together after a restart. These consumers never use that
    thread's connection (each pool call tidies its own, the login's included:
    apps/streams/ws_auth.py), so they skip it."""

    async def dispatch(self, message: dict) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def websocket_disconnect(self, message: dict) -> None:
        """Channels' own, less that tidying."""
        for group in self.groups:
            await self.channel_layer.group_discard(group, self.channel_name)
        await self.disconnect(message["code"])
        raise StopConsumer()
