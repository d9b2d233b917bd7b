"""Item 4: /health/ answers at once whatever state PostgreSQL and Redis are in (up, down or
frozen), naming the one that failed."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import httpx
import pytest
import redis
from django.db import connection

from devstack.stack import embedded_redis, free_port

pytestmark = pytest.mark.django_db(transaction=True)


def test_health_reports_database_and_redis(client):
    response = client.get("/health/")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "redis": "ok"}


@contextlib.contextmanager
def frozen(pid: int):
    """The process stopped (SIGSTOP) as a hung server would be: connected, never answering."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def postmaster_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('data_directory')")
        data_directory = Path(cursor.fetchone()[0])
    try:
        return int((data_directory / "postmaster.pid").read_text().split()[0])
    except OSError:
        pytest.skip("PostgreSQL runs elsewhere: its postmaster cannot be paused from here")


def test_health_answers_at_once_while_redis_or_postgresql_is_frozen(start_web, tmp_path):
    with embedded_redis(tmp_path / "redis", port=free_port()) as redis_url:
        redis_pid = redis.Redis.from_url(redis_url).info()["process_id"]
        # Requests' own Redis calls would wait this long: /health/ must not.
        base = start_web(REDIS_URL=redis_url, REDIS_SOCKET_TIMEOUT="60")
        # The client gives up long before either server would answer or time out.
        with httpx.Client(base_url=base, timeout=10) as http:
            assert http.get("/health/").json() == {"status": "ok", "database": "ok", "redis": "ok"}

            with frozen(redis_pid):
                response = http.get("/health/")
            assert response.status_code == 503
            assert response.json()["database"] == "ok"
            assert response.json()["redis"].startswith("error")

            # New connections wait on the postmaster; those already open keep working.
            with frozen(postmaster_pid()):
                response = http.get("/health/")
            assert response.status_code == 503
            assert response.json()["redis"] == "ok"
            assert response.json()["database"].startswith("error")

    # Redis stopped for good.
    with httpx.Client(base_url=base, timeout=10) as http:
        response = http.get("/health/")
    assert response.status_code == 503
    assert response.json()["redis"].startswith("error")
