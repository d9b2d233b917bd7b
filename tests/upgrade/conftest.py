"""The upgrade test's stage: the previous release checked out from git beside this tree, its own
database migrated by that release, and a whole Sluice (two web processes, an active and a standby
dispatcher, two workers on the simulated engine) whose processes can run either tree's code.

Both trees run on this tree's virtual environment: a process started in the old tree's folder
imports the old tree's packages first (its folder leads `sys.path`). `make test-upgrade` runs
this; `make test` skips it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from django.conf import settings as django_settings

from devstack.stack import VAR_DIR, free_port, web_command
from tests.conftest import BASE_DIR, database_url_for_test_db, process_env, wait_for_http
from tests.faults.conftest import SIM_ANSWER, RedisServer

pytestmark = pytest.mark.slow

# The release this tree upgrades from: the release before this one (the last tree that landed).
# Moved forward when a release lands. .ci/run reads it from this line.
PREVIOUS_RELEASE = "4910120"
# A web process told to stop lets its streams end for this long (core/draining.py).
DRAIN_SECONDS = 20


def previous_tree() -> Path:
    """The previous release's files, as a git worktree under var/ (SLUICE_VAR_DIR; made once,
    then reused)."""
    path = VAR_DIR / "upgrade" / PREVIOUS_RELEASE
    if (path / "manage.py").exists():
        return path
    subprocess.run(["git", "worktree", "prune"], cwd=BASE_DIR, check=False)
    if not _has_commit(PREVIOUS_RELEASE) and _is_shallow():
        # A shallow clone: ask its origin for the history, and say so.
        subprocess.run(["git", "fetch", "--unshallow", "--quiet"], cwd=BASE_DIR, check=False)
        how = "fetched it" if _has_commit(PREVIOUS_RELEASE) else "did not bring it"
        print(f"\n[upgrade] {PREVIOUS_RELEASE}: a shallow checkout; git fetch --unshallow {how}")
    if not _has_commit(PREVIOUS_RELEASE):
        why = (
            f"UPGRADE NOT TESTED: release {PREVIOUS_RELEASE} is not in this checkout's git "
            "history and could not be fetched (a shallow clone without its origin?)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(why)  # CI fails rather than skip
        # Said at the end of the run (make test-upgrade passes -rs), never skipped silently.
        pytest.skip(why)
    made = subprocess.run(
        ["git", "worktree", "add", "--detach", "--force", str(path), PREVIOUS_RELEASE],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
    )
    if made.returncode:
        pytest.fail(
            f"the upgrade test needs release {PREVIOUS_RELEASE} from this checkout's git history "
            f"(a shallow clone lacks it: git fetch --unshallow): {made.stderr.strip()}"
        )
    return path


def _is_shallow() -> bool:
    found = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
    )
    return found.stdout.strip() == "true"


def _has_commit(rev: str) -> bool:
    found = subprocess.run(
        ["git", "cat-file", "-e", f"{rev}^{{commit}}"], cwd=BASE_DIR, capture_output=True
    )
    return found.returncode == 0


def _admin_connection(dbname: str = "postgres") -> psycopg.Connection:
    db = django_settings.DATABASES["default"]
    return psycopg.connect(
        dbname=dbname,
        host=db.get("HOST") or None,
        port=db.get("PORT") or None,
        user=db.get("USER") or None,
        password=db.get("PASSWORD") or None,
        autocommit=True,
    )


@pytest.fixture
def upgrade_database():
    """A database of the test's own (the previous release migrates it, not pytest-django);
    yields its URL and a way to query it."""
    name = f"upgrade_{uuid.uuid4().hex[:8]}"
    with _admin_connection() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    test_name = django_settings.DATABASES["default"]["NAME"]
    url = database_url_for_test_db().replace(f"/{test_name}", f"/{name}", 1)
    yield url, name
    with _admin_connection() as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


def query(dbname: str, sql: str, params: tuple = ()) -> list[tuple]:
    with _admin_connection(dbname) as conn:
        return conn.execute(sql, params).fetchall()


# Run by the previous release's manage.py shell: a roomy plan, a user with an API key, a
# conversation, and a logged-in session for the page's websocket. Prints them as JSON.
SEED = """
import json
from django.test import Client
from apps.accounts.services import api_key_create, user_create
from apps.admission.models import Plan
from apps.chat.services import conversation_create
Plan.objects.update_or_create(slug="free", defaults=dict(name="Free", is_default=True,
    requests_per_minute=100000, burst_requests=100000, tokens_per_minute=10**9,
    burst_tokens=10**9, tokens_per_day=2 * 10**9, max_concurrent=1000,
    max_queue_wait_seconds=120))
user = user_create(username="upgrader", password="correct-horse-battery")
_, key = api_key_create(user=user, name="upgrade")
conversations = [conversation_create(owner=user, title=f"page {i}").id for i in range(4)]
client = Client()
client.force_login(user)
print(json.dumps({"key": key, "conversations": conversations,
                  "session": client.cookies["sessionid"].value}))
"""


@dataclass
class UpgradeStack:
    """Sluice's processes by name; each runs the tree it was started from."""

    env: dict[str, str]
    redis_server: RedisServer
    logs: Path
    old_tree: Path
    dbname: str
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    trees: dict[str, str] = field(default_factory=dict)  # name -> "old" or "new"
    web_urls: dict[str, str] = field(default_factory=dict)

    def tree(self, which: str) -> Path:
        return self.old_tree if which == "old" else BASE_DIR

    def manage(self, which: str, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=self.tree(which),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    def seed(self) -> dict:
        return json.loads(self.manage("old", "shell", "-c", SEED).strip().splitlines()[-1])

    def start(self, name: str, which: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}-{which}.log", "ab")
        process = subprocess.Popen(
            argv,
            cwd=self.tree(which),
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[name] = process
        self.trees[name] = which
        return process

    def web(self, name: str, which: str) -> str:
        port = free_port()
        process = self.start(name, which, web_command("127.0.0.1", port))
        url = f"http://127.0.0.1:{port}"
        wait_for_http(url + "/health/", process)
        self.web_urls[name] = url
        return url

    def dispatcher(self, name: str, which: str) -> None:
        self.start(name, which, [sys.executable, "manage.py", "run_dispatcher"])

    def worker(self, name: str, which: str) -> None:
        argv = [sys.executable, "-m", "worker", "--engine", "simulated", "--slots", "6"]
        argv += ["--worker-id", name, "--heartbeat-interval", "0.5", "--claim-idle-ms", "1000"]
        self.start(name, which, [*argv, "--grace", "15", *SIM_ANSWER, "--sim-tokens", "60"])

    def log(self, name: str, which: str) -> str:
        return (self.logs / f"{name}-{which}.log").read_text(errors="replace")

    def stop(self, name: str, *, timeout: float = DRAIN_SECONDS + 15) -> int:
        """SIGTERM, as an operator's deploy sends it; returns the exit status."""
        process = self.processes[name]
        process.terminate()
        return process.wait(timeout=timeout)

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.fixture
def upgrade_stack(transactional_db, redis_prefix, upgrade_database, tmp_path):
    url, dbname = upgrade_database
    redis_server = RedisServer(tmp_path / "redis")
    redis_server.start()
    (tmp_path / "logs").mkdir()
    env = dict(
        process_env(redis_prefix),
        DATABASE_URL=url,
        REDIS_URL=redis_server.url,
        LOG_LEVEL="INFO",
        SLUICE_DISPATCHER_LEASE_MS="1500",
        SLUICE_WEB_DRAIN_SECONDS=str(DRAIN_SECONDS),
    )
    stack = UpgradeStack(
        env=env,
        redis_server=redis_server,
        logs=tmp_path / "logs",
        old_tree=previous_tree(),
        dbname=dbname,
    )
    yield stack
    stack.stop_all()
    redis_server.stop()
