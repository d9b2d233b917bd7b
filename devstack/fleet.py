"""The deployment of docs/deploy.md on one box, to start and look at: `python -m devstack.fleet`.

A Redis Cluster (three masters, a replica each, from the bundled redis-server), PostgreSQL as
`make run` has it (embedded, under var/fleet/, unless DATABASE_URL is set), three web processes on
ports of their own behind a small round-robin proxy, two dispatchers (one holds the lease, one
stands by) and workers on two "machines": environments that name only Redis, never PostgreSQL
or Django. With RAG_EMBEDDING_SERVING=fleet (environment or .env) each machine also runs an
embedding worker (`python -m worker embed`, MiniLM in-process). Each process logs to
var/fleet/logs/<name>.log. Ctrl-C (or SIGTERM) stops every process, then the cluster (its data
goes with it) and PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from contract import cluster
from contract.protocol import Keys
from devstack.cluster import local_cluster
from devstack.stack import (
    BASE_DIR,
    VAR_DIR,
    Supervisor,
    embedded_postgres,
    embedding_on_fleet,
    free_port,
    manage,
    say,
    settings_env,
    web_command,
)

FLEET_DIR = VAR_DIR / "fleet"
WEB_PROCESSES = 3
DISPATCHERS = ("dispatcher-a", "dispatcher-b")
MACHINES = ("box1", "box2")
# What a GPU machine's worker never sees: it knows Redis and its model, nothing of Django.
DJANGO_ONLY = ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "SECRET_KEY")


# -- the proxy: one port in front of the web processes, as nginx would be ------------------------


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copies bytes as they come (no buffering: websocket frames and SSE events pass at once);
    at the end of input, half-closes the other side so an answer in flight still arrives."""
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError, RuntimeError):
        if not writer.is_closing() and writer.can_write_eof():
            writer.write_eof()


async def serve_proxy(host: str, port: int, backends: list[tuple[str, int]]) -> None:
    """Each new connection goes to the next web process in turn (a refused one is skipped).
    TCP, not HTTP: a kept-alive connection's requests all reach one process (nginx would spread
    them), which changes nothing here since any web process serves any request."""
    turn = itertools.cycle(backends)

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        for _ in backends:
            try:
                upstream_r, upstream_w = await asyncio.open_connection(*next(turn))
                break
            except OSError:
                continue
        else:
            client_w.close()
            return
        try:
            # The request side may end first (a half-close); the answer side ending ends both.
            requests = asyncio.ensure_future(_pipe(client_r, upstream_w))
            await _pipe(upstream_r, client_w)
            requests.cancel()
        finally:
            for writer in (client_w, upstream_w):
                writer.close()

    server = await asyncio.start_server(handle, host, port)
    async with server:
        await server.serve_forever()


def command_proxy(args: argparse.Namespace) -> int:
    backends = [("127.0.0.1", int(p)) for p in args.to.split(",")]
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_proxy(args.host, args.port, backends))
    return 0


# -- the fleet ------------------------------------------------------------------------------------


def default_engine() -> str:
    """`make run`'s engine (WORKER_ENGINE, else llama.cpp with the bundled SmolLM2); the
    simulated one only where llama-cpp-python is not installed, and then it says so."""
    engine = os.environ.get("WORKER_ENGINE", "").strip()
    if engine:
        return engine
    if importlib.util.find_spec("llama_cpp") is not None:
        return "llamacpp"
    say("llama-cpp-python is not installed: the workers run the SIMULATED engine (no real answers)")
    return "simulated"


@contextlib.contextmanager
def redis_for_fleet(root: Path) -> Iterator[str]:
    """REDIS_URL from the environment when set, else a fresh local cluster under `root`."""
    if os.environ.get("REDIS_URL"):
        say("Using REDIS_URL from the environment")
        yield os.environ["REDIS_URL"]
        return
    with local_cluster(root) as local:
        yield local.url


@contextlib.contextmanager
def postgres_for_fleet() -> Iterator[str]:
    """DATABASE_URL from the environment when set, else an embedded PostgreSQL as `make run`
    starts one, in a data directory of its own: `make run`'s server is stopped by whoever
    started it last, so sharing it would stop it under a running `make run`."""
    if os.environ.get("DATABASE_URL"):
        say("Using DATABASE_URL from the environment")
        yield os.environ["DATABASE_URL"]
        return
    with embedded_postgres(FLEET_DIR / "postgres") as url:
        yield url


def prepare_database(env: dict[str, str], *, corpus: bool = True) -> None:
    """What `make run` does before it starts anything: migrations, demo accounts, the demo
    corpus (unchanged documents are skipped) and its relevance gate."""
    say("applying migrations")
    manage(env, "migrate", "--no-input", "-v", "1")
    manage(env, "seed_demo")
    if corpus:  # before the embedding workers run: MiniLM in these commands' own process
        local = dict(env, RAG_EMBEDDING_SERVING="local")
        manage(local, "ingest", "sluice-docs", "docs/", "--access", "everyone")
        manage(local, "rag_eval", "sluice-docs", "bench/sluice_docs_questions.jsonl", "--calibrate")


def machine_env(env: dict[str, str]) -> dict[str, str]:
    """A GPU machine's environment: REDIS_URL (and the key prefix), nothing of the database."""
    return {k: v for k, v in env.items() if k not in DJANGO_ONLY}


class FleetSupervisor(Supervisor):
    """Unlike `make run`'s, it keeps the rest running when a process exits: killing a web
    process or the leading dispatcher is what one starts a fleet to try. Only the proxy's exit
    (nothing reachable any more) or Ctrl-C stops it."""

    def wait(self) -> int:
        reported: set[str] = set()
        while self._stop_signal is None:
            for name, process in self.children:
                code = process.poll()
                if code is None or name in reported:
                    continue
                reported.add(name)
                if name == "proxy":
                    say(f"the proxy exited with code {code}; stopping the rest")
                    return code or 1
                say(f"{name} exited with code {code}; the rest go on (Ctrl-C stops them)")
            time.sleep(0.2)
        say("stopping…")
        return 0


class Fleet:
    """Starts the processes under one supervisor, each with its own environment and log."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.supervisor = FleetSupervisor(env=env)  # from here on Ctrl-C asks for an orderly stop
        self.web_ports: list[int] = []
        self.workers: list[str] = []
        self.embedders: list[str] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        with open(self.logs / f"{name}.log", "wb") as log:  # the child keeps its own copy
            process = subprocess.Popen(
                argv,
                env=env or self.env,
                cwd=BASE_DIR,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.supervisor.children.append((name, process))

    def start_all(self, *, host: str, port: int, engine: str, per_machine: int) -> None:
        taken = {port}
        for i in range(1, WEB_PROCESSES + 1):
            web_port = _free_port_near(port + i, taken)
            self.web_ports.append(web_port)
            self.start(f"web{i}", web_command("127.0.0.1", web_port))
        for name in DISPATCHERS:
            self.start(name, [sys.executable, "manage.py", "run_dispatcher"])
        for machine in MACHINES:
            for n in range(1, per_machine + 1):
                worker_id = f"{machine}-w{n}"
                self.workers.append(worker_id)
                argv = [
                    sys.executable,
                    "-m",
                    "worker",
                    "--engine",
                    engine,
                    "--worker-id",
                    worker_id,
                ]
                self.start(worker_id, argv, env=machine_env(self.env))
            if embedding_on_fleet(self.env):  # the bundled MiniLM, as the web would run it
                embedder = f"{machine}-embed"
                self.embedders.append(embedder)
                argv = [sys.executable, "-m", "worker", "embed", "--worker-id", embedder]
                self.start(embedder, argv, env=machine_env(self.env))
        to = ",".join(map(str, self.web_ports))
        self.start(
            "proxy",
            [
                sys.executable,
                "-m",
                "devstack.fleet",
                "proxy",
                "--host",
                host,
                "--port",
                str(port),
                "--to",
                to,
            ],
        )

    def announce_when_ready(self, *, host: str, port: int) -> None:
        """Prints the addresses once every web process answers and every worker beats (a
        worker loads its model first); in a thread, so Ctrl-C works meanwhile."""

        def wait_then_print() -> None:
            try:
                for web_port in self.web_ports:
                    _wait_for(lambda p=web_port: _answers(f"http://127.0.0.1:{p}/health/"))
                _wait_for(lambda: _answers(f"http://{host}:{port}/health/"))
                beating = lambda: _all_beating(self.env, self.workers, self.embedders)  # noqa: E731
                _wait_for(beating, timeout=300)
            except TimeoutError as exc:
                say(f"not ready: {exc} (see the logs in {self.logs})")
                return
            urls = {f"web{i}": f"http://127.0.0.1:{p}/" for i, p in enumerate(self.web_ports, 1)}
            urls["proxy"] = f"http://{host}:{port}/  (round robin over web1-3)"
            for name, process in self.supervisor.children:
                say(f"  {name:<13} pid {process.pid:<8} {urls.get(name, '')}")
            say(f"REDIS_URL={self.env['REDIS_URL']}; logs in {self.logs}")
            say(
                f"the fleet is up: http://{host}:{port}/  (demo logins admin / sluice-admin, "
                "demo / sluice-demo; Ctrl-C stops everything)"
            )

        threading.Thread(target=wait_then_print, daemon=True).start()


def bindable(port: int) -> bool:
    """Whether a listening socket can take `port` now. Stricter than nothing listening on it:
    an outgoing connection that holds it as its local port makes a server's bind fail too."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port_near(preferred: int, taken: set[int]) -> int:
    """`preferred` or the next port above it that a server can bind, else any free one."""
    for port in range(preferred, min(preferred + 100, 65536)):
        if port not in taken and bindable(port):
            break
    else:
        port = free_port()
    taken.add(port)
    return port


def _wait_for(check, *, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"still waiting after {timeout:.0f}s")
        time.sleep(0.5)


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _all_beating(env: dict[str, str], workers: list[str], embedders: list[str]) -> bool:
    import redis

    url = env["REDIS_URL"]
    if cluster.is_cluster_url(url):
        client = cluster.sync_client(url, max_connections=2, timeout=2, connect_timeout=1)
    else:
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=1)
    keys = Keys(prefix=env.get("SLUICE_REDIS_PREFIX", "sluice"))
    try:
        beats = [keys.heartbeat(w) for w in workers] + [keys.embedder(e) for e in embedders]
        return all(client.exists(key) for key in beats)
    except redis.RedisError:
        return False
    finally:
        client.close()


def command_run(args: argparse.Namespace) -> int:
    host = os.environ.get("SLUICE_HOST", "127.0.0.1")
    port = args.port or int(os.environ.get("SLUICE_PORT", "8000"))
    if not bindable(port):
        say(f"port {port} is taken: choose another with SLUICE_PORT or --port")
        return 1
    engine = args.engine or default_engine()
    logs = FLEET_DIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = settings_env(dict(os.environ, PYTHONUNBUFFERED="1"))
    env.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")
    if embedding_on_fleet(env):
        say(
            "retrieval on the fleet (RAG_EMBEDDING_SERVING=fleet): an embedding worker "
            "(python -m worker embed, all-MiniLM-L6-v2) on each machine; the web processes "
            "never load the model"
        )
    else:
        say("retrieval: all-MiniLM-L6-v2 in each web process (RAG_EMBEDDING_SERVING=local)")
    with postgres_for_fleet() as database_url, redis_for_fleet(FLEET_DIR / "redis") as redis_url:
        env.update(DATABASE_URL=database_url, REDIS_URL=redis_url)
        prepare_database(env, corpus=not args.no_corpus)
        fleet = Fleet(env, logs)
        try:
            fleet.start_all(host=host, port=port, engine=engine, per_machine=args.workers)
            fleet.announce_when_ready(host=host, port=port)
            code = fleet.supervisor.wait()
        finally:
            fleet.supervisor.stop_all()
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.fleet", description=__doc__)
    parser.add_argument(
        "--port",
        type=int,
        default=0,
        help="the proxy's port; the web processes take the next free ones "
        "(default SLUICE_PORT, else 8000)",
    )
    parser.add_argument("--workers", type=int, default=1, help="workers per machine (default 1)")
    parser.add_argument("--engine", default="", help="the workers' engine (default: make run's)")
    parser.add_argument(
        "--no-corpus",
        action="store_true",
        help="skip ingesting the demo corpus (half a minute the first time)",
    )
    sub = parser.add_subparsers(dest="command")
    proxy = sub.add_parser("proxy", help="only the round-robin proxy (the fleet starts it)")
    proxy.add_argument("--host", default="127.0.0.1")
    proxy.add_argument("--port", type=int, required=True)
    proxy.add_argument("--to", required=True, help="the web processes' ports, comma-separated")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return command_proxy(args) if args.command == "proxy" else command_run(args)


if __name__ == "__main__":
    sys.exit(main())
