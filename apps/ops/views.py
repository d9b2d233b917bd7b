from __future__ import annotations

import asyncio

import psycopg
import redis.asyncio as aioredis
from django.conf import settings
from django.db import connections
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from contract import cluster


@require_GET
async def health(request: HttpRequest) -> JsonResponse:
    """Liveness of the web process and its two backing services, for load balancers.

    It answers within about HEALTH_CHECK_TIMEOUT whatever state they are in: each is asked at
    once over a connection of its own with that deadline, not through the process's pools (a
    frozen Redis holds a pooled connection for the full socket timeout; a frozen PostgreSQL
    holds one forever, and an exhausted pool would make a busy process look dead). Async, so
    it never waits for a thread either.
    """
    timeout = settings.HEALTH_CHECK_TIMEOUT
    database, redis_ = await asyncio.gather(
        _checked(_database_ping(timeout), timeout), _checked(_redis_ping(timeout), timeout)
    )
    checks = {"database": database, "redis": redis_}
    healthy = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "degraded", **checks}, status=200 if healthy else 503
    )


async def _checked(ping, timeout: float) -> str:
    try:
        async with asyncio.timeout(timeout):
            await ping
    except TimeoutError:
        return f"error: no answer within {timeout:g}s"
    except Exception as exc:  # any failure means unhealthy; the class name helps the operator
        return f"error: {exc.__class__.__name__}"
    return "ok"


async def _database_ping(timeout: float) -> None:
    params = connections["default"].get_connection_params()
    # The ORM's adapters and cursor class are for synchronous connections.
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params["connect_timeout"] = max(2, int(timeout))  # libpq's minimum; wait_for bounds it
    params["application_name"] = "sluice-health"
    conn = await psycopg.AsyncConnection.connect(**params, autocommit=True)
    try:
        await conn.execute("SELECT 1")
    finally:
        await conn.close()


async def _redis_ping(timeout: float) -> None:
    if cluster.is_cluster_url(settings.REDIS_URL):
        client = cluster.async_client(
            settings.REDIS_URL, socket_timeout=timeout, connect_timeout=timeout, max_connections=1
        )
    else:
        client = aioredis.Redis.from_url(
            settings.REDIS_URL,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            single_connection_client=True,
        )
    try:
        await client.ping()
    finally:
        await client.aclose()
