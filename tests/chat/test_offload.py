"""The websocket's database calls: a recent health check is not repeated before every call."""

from __future__ import annotations

from django.db import connections

from apps.streams.offload import HEALTH_CHECK_SECONDS, tidy_connections


def test_a_health_check_runs_at_most_once_a_second_per_connection(transactional_db, monkeypatch):
    conn = connections["default"]
    assert conn.settings_dict["CONN_HEALTH_CHECKS"]
    checks = []
    real_check = conn.is_usable
    monkeypatch.setattr(conn, "is_usable", lambda: checks.append(1) or real_check())

    def call(at: float) -> None:
        """What one pooled call does: tidy, a query, tidy."""
        tidy_connections(now=at)
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1")
        tidy_connections(now=at)

    conn.close()
    call(1000.0)  # a fresh connection counts as checked
    call(1000.1)
    call(1000.2)
    assert checks == []
    call(1000.0 + HEALTH_CHECK_SECONDS + 0.5)  # the check is stale: this call checks again
    assert len(checks) == 1
    call(1000.0 + HEALTH_CHECK_SECONDS + 0.6)
    assert len(checks) == 1


def test_a_connection_that_failed_is_checked_at_once(transactional_db, monkeypatch):
    conn = connections["default"]
    checks = []
    real_check = conn.is_usable
    monkeypatch.setattr(conn, "is_usable", lambda: checks.append(1) or real_check())
    conn.close()
    tidy_connections(now=1000.0)
    with conn.cursor() as cursor:
        cursor.execute("SELECT 1")
    tidy_connections(now=1000.0)
    conn.errors_occurred = True  # as Django marks it after a database error
    tidy_connections(now=1000.1)
    assert checks == [1]
    assert conn.connection is not None and not conn.errors_occurred
