"""The worker's Redis client: commands packed by hiredis' C packer, replies that have
arrived read without a timer.

redis-py's synchronous client already packs with hiredis when it is installed; its asyncio
client packs in Python, argument by argument. A worker streaming a hundred answers sends a few
thousand commands a second, and that packing was about a fifth of its CPU.

redis-py's asyncio client also arms a timeout (a timer scheduled on the loop, then cancelled)
around the read of every reply, a pipeline's included, whose replies arrive together: most of a
pipeline's reads find their reply already in the parser's buffer, and then no timer is needed.
A reply not yet (wholly) arrived is read as redis-py reads it, under the socket timeout, so a
frozen Redis still fails the read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis._parsers.hiredis import NOT_ENOUGH_DATA  # what its reader's gets() says then
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError

from contract import cluster

log = logging.getLogger("sluice.worker")

# Called once the current task's next write has reached the connection (CommandBatcher's
# `sent`): the commands are then on their way to Redis, whatever happens to this process.
_AFTER_WRITE: ContextVar[list[Callable[[], Any]] | None] = ContextVar("after_write", default=None)


@contextlib.contextmanager
def after_write(callbacks: list[Callable[[], Any]]) -> Iterator[None]:
    """Within it, the task's first write over a HiredisPackedConnection calls `callbacks`."""
    token = _AFTER_WRITE.set(callbacks or None)
    try:
        yield
    finally:
        _AFTER_WRITE.reset(token)


class HiredisPackedConnection(aioredis.Connection):
    # Inside a connect or a write: the writes made there (the handshake's CLIENT SETNAME, a
    # health check's PING) come before the task's own and must not count as it.
    _inside = 0

    async def connect_check_health(self, *args, **kwargs) -> None:
        self._inside += 1
        try:
            await super().connect_check_health(*args, **kwargs)
        finally:
            self._inside -= 1

    async def send_packed_command(self, command, check_health: bool = True) -> None:
        self._inside += 1
        try:
            await super().send_packed_command(command, check_health)
        finally:
            self._inside -= 1
        callbacks = _AFTER_WRITE.get()
        if callbacks and not self._inside:
            _AFTER_WRITE.set(None)  # once: a retry's write calls them again from its own block
            for callback in callbacks:
                try:
                    callback()
                except Exception:  # the caller's failure, not the pipeline's
                    log.exception("a callback after a Redis write failed")

    async def read_response(self, disable_decoding: bool = False, timeout=None, **options):
        reader = getattr(self._parser, "_reader", None)  # hiredis' reader; RESP2 replies only
        if (
            timeout is not None
            or options
            or reader is None
            or self.protocol in ("3", 3)
            or not getattr(self._parser, "_connected", False)
        ):
            return await super().read_response(disable_decoding, timeout, **options)
        reply = reader.gets(False) if disable_decoding else reader.gets()
        if reply is NOT_ENOUGH_DATA:  # not all here yet: what arrived stays in the buffer
            return await super().read_response(disable_decoding, timeout)
        if isinstance(reply, RedisConnectionError) or (
            isinstance(reply, list) and reply and isinstance(reply[0], RedisConnectionError)
        ):  # as redis-py's parser and connection treat it
            await self.disconnect(nowait=True)
            raise reply if isinstance(reply, RedisConnectionError) else reply[0]
        if self.health_check_interval:
            self.next_health_check = asyncio.get_running_loop().time() + self.health_check_interval
        if isinstance(reply, ResponseError):
            raise reply from None
        return reply

    def pack_command(self, *args) -> list[bytes]:
        # A command name holding several words ("CLIENT SETNAME") goes as separate arguments,
        # as redis-py sends it.
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError as exc:  # None, a bool, a dict: what redis-py's encoder refuses too
            raise DataError(str(exc)) from exc

    def pack_commands(self, commands: Iterable[Iterable]) -> list[bytes]:
        return [b"".join(self.pack_command(*command)[0] for command in commands)]


def connect(
    url: str,
    *,
    max_connections: int = 8,
    socket_timeout: float = 10.0,
    connect_timeout: float = 5.0,
    **options,
) -> aioredis.Redis:
    """An asyncio client for `url` with a bounded pool (callers wait for a free connection)
    and timeouts, so a frozen Redis fails a command instead of hanging it; `socket_timeout`
    must exceed the longest blocking read (the work read blocks 1 s). Over plain TCP its
    connections pack with hiredis. A `redis+cluster://` URL gives redis-py's cluster client:
    a work read names streams of one slot (their shared tag), a request's writes one slot each,
    and its pipelines are split by node."""
    if cluster.is_cluster_url(url):
        return cluster.async_client(
            url, socket_timeout=socket_timeout, connect_timeout=connect_timeout, **options
        )
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=socket_timeout,
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
        **options,
    )
    if pool.connection_class is aioredis.Connection:  # TLS connections keep redis-py's packer
        pool.connection_class = HiredisPackedConnection
    return aioredis.Redis(connection_pool=pool)
