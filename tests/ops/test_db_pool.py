"""Item 7: a web process borrows PostgreSQL connections from a bounded pool, so a burst of
concurrent requests neither fails nor opens a connection per request."""

from __future__ import annotations

import asyncio
import threading

import httpx
import psycopg
import pytest
from django.db import connection
from django.urls import reverse

from apps.chat.services import conversation_create, message_create
from tests.security.conftest import logged_in

pytestmark = pytest.mark.django_db(transaction=True)

POOL_SIZE = 4
CONCURRENT = 64
CLIENT_BACKENDS = """
    SELECT count(*), count(*) FILTER (WHERE application_name = 'sluice-web')
    FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'
"""


def watcher() -> psycopg.Connection:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=True)


async def burst(base_url: str, session_key: str, path: str) -> list[int]:
    limits = httpx.Limits(max_connections=CONCURRENT)
    async with httpx.AsyncClient(
        base_url=base_url, timeout=60, limits=limits, cookies={"sessionid": session_key}
    ) as http:
        responses = await asyncio.gather(*(http.get(path) for _ in range(CONCURRENT)))
    return [response.status_code for response in responses]


def test_64_concurrent_requests_stay_within_the_pool(start_web, user):
    conversation = conversation_create(owner=user)
    message_create(conversation=conversation, role="user", text="hello")
    _, session_key = logged_in(user)
    base = start_web(DATABASE_POOL_MAX_SIZE=str(POOL_SIZE), DATABASE_POOL_MIN_SIZE="1")
    peak = {"total": 0, "web": 0}
    with watcher() as conn:
        baseline = conn.execute(CLIENT_BACKENDS).fetchone()[0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                total, web = conn.execute(CLIENT_BACKENDS).fetchone()
                peak["total"] = max(peak["total"], total)
                peak["web"] = max(peak["web"], web)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            path = reverse("chat:conversation", args=[conversation.id])
            statuses = asyncio.run(burst(base, session_key, path))
        finally:
            done.set()
            sampler.join()

    assert statuses == [200] * CONCURRENT
    assert peak["total"] - baseline <= POOL_SIZE, peak
    assert 1 <= peak["web"] <= POOL_SIZE, peak  # the pool's own, seen by the sampler
