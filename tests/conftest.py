"""Fixtures shared by every test: real PostgreSQL and Redis (started by `make test`), with each
test's Redis keys under a prefix of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import httpx
import hypothesis  # noqa: F401  (imported at collection: a late import in pytest's summary hook can trip CPython 3.11's AST recursion check)
import pytest
from django.conf import settings as django_settings
from django.test import Client

from apps.accounts.services import user_create
from apps.streams import offload
from core.redis_client import get_redis
from devstack.stack import free_port, socket_database_url, web_command
from tests import loop_watch

loop_watch.install()  # a test stuck in its event loop's close names the task that holds it

BASE_DIR = Path(__file__).resolve().parent.parent


_TIMED_OUT: list[str] = []
_HARNESS_FRAMES = ("/_pytest/", "/pluggy/", "pytest_timeout", "pytest_asyncio")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Remembers where a test that pytest-timeout stopped was: its thread's last frames. The
    other threads' stacks come first in the report, so a log's tail would not show them."""
    outcome = yield
    crash = getattr(outcome.get_result().longrepr, "reprcrash", None)
    if call.excinfo is None or crash is None or "pytest-timeout" not in crash.message:
        return
    frames = [
        entry
        for entry in call.excinfo.traceback
        if not any(part in str(entry.path) for part in _HARNESS_FRAMES)
    ][-5:]
    where = " < ".join(
        f"{Path(str(entry.path)).name}:{entry.lineno + 1} {entry.name}"
        for entry in reversed(frames)
    )
    _TIMED_OUT.append(f"{item.nodeid} ({call.when}): {where or 'in the test harness'}")


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    for line in _TIMED_OUT:
        terminalreporter.write_line(f"timed out: {line}")


@pytest.fixture(scope="session", autouse=True)
def db_call_pool_closed(django_db_setup):
    """The websocket's database pool threads hold connections to the test database: they are
    closed before it is dropped."""
    yield
    offload.shutdown()


@pytest.fixture(autouse=True)
def redis_prefix(settings):
    """Every Redis key a test writes lives under its own prefix, deleted afterwards."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    settings.SLUICE_REDIS_PREFIX = prefix
    # The cache too (the account forms' rate limits count in it): no test inherits another's.
    settings.CACHES = {
        name: {**config, "KEY_PREFIX": f"{prefix}:cache"}
        for name, config in django_settings.CACHES.items()
    }
    yield prefix
    client = get_redis()
    stale = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if stale:
        client.delete(*stale)


@pytest.fixture
def short_answers(settings):
    """Short answers keep the real model quick; the context window stays realistic. Request
    it before live_web: the web process reads it from its environment."""
    settings.MODEL_MAX_TOKENS = 24
    settings.MODEL_TEMPERATURE = 0.0


@pytest.fixture
def user(db):
    return user_create(username="alice", password="correct-horse-battery")


@pytest.fixture
def other_user(db):
    return user_create(username="mallory", password="correct-horse-battery")


@pytest.fixture
def client_for():
    def make(user) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return make


def wait_until(
    check, *, timeout: float = 60, what: str = "condition", every: float = 0.1, step=None
):
    """Polls `check` until it returns something truthy, and returns that; fails after `timeout`
    seconds naming `what`. `step`, when given, runs before each look (a dispatcher pass, say)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if step is not None:
            step()
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def read_sse(
    response: httpx.Response, *, stop_after: int | None = None, into: list | None = None
) -> list[dict]:
    """Parses an SSE body into [{"id", "event", "data"}] until a final event (or `stop_after`
    events). Each event lands in `into` as it arrives, so a reader whose connection is cut keeps
    what it read."""
    events = [] if into is None else into
    current: dict = {}
    for line in response.iter_lines():
        if not line:
            if "data" in current:
                current["data"] = json.loads(current["data"])
                events.append(current)
                if current["event"] == "final" or (stop_after and len(events) >= stop_after):
                    return events
            current = {}
            continue
        field, _, value = line.partition(": ")
        if field in ("id", "event", "data"):
            current[field] = value
    return events


def database_url_for_test_db() -> str:
    """A URL other processes can use to reach the test database pytest-django created."""
    db = django_settings.DATABASES["default"]
    if (db.get("HOST") or "").startswith("/"):
        return socket_database_url(
            socket_dir=db["HOST"], port=db.get("PORT") or 5432, name=db["NAME"], user=db["USER"]
        )
    auth = quote(db.get("USER") or "", safe="")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"], safe="")
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}@{db['HOST']}{port}/{db['NAME']}"


def process_env(prefix: str) -> dict[str, str]:
    return dict(
        os.environ,
        DATABASE_URL=database_url_for_test_db(),
        SLUICE_REDIS_PREFIX=prefix,
        DJANGO_SETTINGS_MODULE="chatsite.settings.test",
        PYTHONUNBUFFERED="1",
        # The web process builds prompts: it takes the answer length the test set.
        MODEL_MAX_TOKENS=str(django_settings.MODEL_MAX_TOKENS),
        MODEL_TEMPERATURE=str(django_settings.MODEL_TEMPERATURE),
    )


def wait_for_http(url: str, process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited with {process.returncode}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout}s")


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def live_web(transactional_db, redis_prefix):
    """A real daphne process serving Sluice on a free port, against the test database."""
    port = free_port()
    process = subprocess.Popen(
        web_command("127.0.0.1", port), cwd=BASE_DIR, env=process_env(redis_prefix)
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(base_url + "/health/", process)
        yield base_url
    finally:
        stop_process(process)


@pytest.fixture
def start_worker(redis_prefix):
    """Starts `python -m worker` processes; all are stopped (or killed) after the test."""
    started: list[subprocess.Popen] = []

    def start(worker_id: str, *, engine: str = "llamacpp", slots: int = 1, extra=()):
        argv = [
            sys.executable,
            "-m",
            "worker",
            "--engine",
            engine,
            "--slots",
            str(slots),
            "--worker-id",
            worker_id,
            "--redis-url",
            django_settings.REDIS_URL,
            "--prefix",
            redis_prefix,
            "--heartbeat-interval",
            "0.5",
            "--claim-idle-ms",
            "1000",
            "--grace",
            "5",
            *extra,
        ]
        process = subprocess.Popen(argv, cwd=BASE_DIR, env=process_env(redis_prefix))
        started.append(process)
        return process

    yield start
    for process in started:
        stop_process(process)


@pytest.fixture
def dispatcher(transactional_db, redis_prefix):
    """`manage.py run_dispatcher` against the test database: it records finished answers."""
    process = subprocess.Popen(
        [sys.executable, "manage.py", "run_dispatcher"],
        cwd=BASE_DIR,
        env=process_env(redis_prefix),
    )
    yield process
    stop_process(process)
