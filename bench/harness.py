"""What the request-path benchmarks share: a throwaway Sluice (embedded PostgreSQL and Redis,
daphne, the dispatcher, a simulated worker) and websocket clients that speak the chat protocol."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from devstack.stack import Supervisor, backing_services, free_port, manage, say, web_command  # noqa: E402


@dataclass
class Running:
    env: dict[str, str]
    base_url: str
    ws_url: str
    supervisor: Supervisor
    ws_urls: list[str] = field(default_factory=list)  # one per web process
    var: Path | None = None

    def pid_of(self, name: str) -> int:
        return next(p.pid for n, p in self.supervisor.children if n == name)

    def processes(self) -> dict[str, list[int]]:
        """Every process of this Sluice by role: its own children, and Redis and PostgreSQL
        (the postmaster and the backends it forked)."""
        roles: dict[str, list[int]] = {}
        for name, process in self.supervisor.children:
            roles.setdefault(name.split("-")[0], []).append(process.pid)
        port = urlsplit(self.env["REDIS_URL"]).port
        parents = _parents()
        for pid, cmdline in _cmdlines().items():
            if "redis-server" in cmdline and f":{port}" in cmdline:
                roles.setdefault("redis", []).append(pid)
        postmaster = _postmaster(self.var / "postgres") if self.var else None
        if postmaster:
            roles["postgres"] = [postmaster, *(p for p, up in parents.items() if up == postmaster)]
        return roles

    def redis_calls(self) -> dict[str, int]:
        """Redis's own count of each command it has run so far (INFO commandstats)."""
        import redis

        stats = redis.Redis.from_url(self.env["REDIS_URL"]).info("commandstats")
        return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) each role has used so far: read twice around a run, the
        difference is what the run cost each process."""
        tick = os.sysconf("SC_CLK_TCK")
        return {
            role: sum(_cpu_ticks(pid) for pid in pids) / tick
            for role, pids in self.processes().items()
        }


def _stat_fields(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def process_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) one process has used so far."""
    return _cpu_ticks(pid) / os.sysconf("SC_CLK_TCK")


def _cpu_ticks(pid: int) -> int:
    fields = _stat_fields(pid)
    return int(fields[11]) + int(fields[12]) if fields else 0  # utime, stime


def tree_cpu_seconds(roots: dict[str, list[int]]) -> dict[str, float]:
    """CPU time (user + system) each role's processes have used so far, with every process
    below them: live descendants by their own counts, and those that have exited by their
    parent's count of reaped children (cutime, cstime): PostgreSQL's backends, for one, come
    and go with the connections."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    found: dict[str, float] = {}
    for role, pids in roots.items():
        tree, todo = set(), list(pids)
        while todo:
            pid = todo.pop()
            if pid not in tree:
                tree.add(pid)
                todo += children.get(pid, [])
        ticks = 0
        for pid in tree:
            fields = _stat_fields(pid)
            ticks += sum(int(f) for f in fields[11:15]) if fields else 0  # with reaped children
        found[role] = ticks / os.sysconf("SC_CLK_TCK")
    return found


def _parents() -> dict[int, int]:
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat_fields(int(stat.parent.name))
        if fields:
            found[int(stat.parent.name)] = int(fields[1])
    return found


def _cmdlines() -> dict[int, str]:
    found = {}
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            found[int(path.parent.name)] = path.read_bytes().replace(b"\0", b" ").decode()
    return found


def _postmaster(datadir: Path) -> int | None:
    try:
        return int((datadir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cpu_per_answer(before: dict[str, float], after: dict[str, float], answers: int) -> dict:
    """Milliseconds of CPU per answer, per role, between two `cpu_seconds` readings."""
    answers = max(answers, 1)
    return {role: (after.get(role, 0) - before.get(role, 0)) * 1000 / answers for role in after}


@contextlib.contextmanager
def sluice(
    *,
    worker_args: list[str],
    env_extra: dict[str, str] | None = None,
    web_processes: int = 1,
) -> Iterator[Running]:
    """A whole Sluice on fresh data under var/bench/, stopped on exit. With several web
    processes, each listens on its own port (a load balancer's job in production)."""
    var = BASE_DIR / "var" / "bench" / f"run-{os.getpid()}"
    try:
        with backing_services(var) as urls:
            env = dict(os.environ, **urls, **(env_extra or {}))
            env["DJANGO_SETTINGS_MODULE"] = "chatsite.settings.dev"
            env["DEBUG"] = "false"
            env["LOG_LEVEL"] = "WARNING"
            env["RAG_WARM_UP"] = "false"  # no corpora here: the model would only take memory
            # The benches measure the request path against the engine driven directly; work
            # Sluice starts itself (follow-up questions, titles, tag proposals, and summaries of
            # the long conversations a bench client builds in a minute) would be engine load
            # the direct side never gets. A caller may turn it back on.
            for name, off in (
                ("SLUICE_FOLLOWUPS", "false"),
                ("SLUICE_TITLES", "false"),
                ("SLUICE_TAG_PROPOSAL_EVERY", "0"),
                ("SLUICE_SUMMARIES", "false"),
            ):
                env.setdefault(name, off)
            os.environ.update(urls)
            manage(env, "migrate", "--no-input", "-v", "0")
            ports = [free_port() for _ in range(web_processes)]
            supervisor = Supervisor(env=env)
            python = sys.executable
            for n, port in enumerate(ports):
                supervisor.start(
                    "web" if n == 0 else f"web-{n + 1}", web_command("127.0.0.1", port)
                )
            supervisor.start("dispatcher", [python, "manage.py", "run_dispatcher"])
            supervisor.start("worker", [python, "-m", "worker", *worker_args])
            try:
                for port in ports:
                    wait_for_port(port)
                ws_urls = [f"ws://127.0.0.1:{port}" for port in ports]
                yield Running(
                    env, f"http://127.0.0.1:{ports[0]}", ws_urls[0], supervisor, ws_urls, var
                )
            finally:
                supervisor.stop_all()
    finally:
        shutil.rmtree(var, ignore_errors=True)


def wait_for_port(port: int, timeout: float = 60) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on port {port}")


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")
    import django

    django.setup()


def make_sessions(count: int, *, prefix: str = "bench") -> list[tuple[str, int]]:
    """`count` users, each with a session cookie and a conversation of their own."""
    from django.contrib.auth.hashers import make_password
    from django.test import Client

    from apps.accounts.models import Profile, User
    from apps.admission.models import Plan
    from apps.chat.services import conversation_create

    # The benchmarks measure the request path, not the rate limits: one plan that admits all.
    Plan.objects.filter(is_default=True).update(
        requests_per_minute=1_000_000,
        burst_requests=1_000_000,
        tokens_per_minute=10**9,
        burst_tokens=10**9,
        tokens_per_day=10**9,
        max_concurrent=10_000,
    )
    hashed = make_password("bench-password-1")  # hashed once: hashing is slow on purpose
    sessions = []
    for i in range(count):
        user = User.objects.create(username=f"{prefix}{i}", password=hashed)
        Profile.objects.create(user=user, display_name=user.username)
        client = Client()
        client.force_login(user)
        conversation = conversation_create(owner=user, title=f"bench {i}")
        sessions.append((client.cookies["sessionid"].value, conversation.id))
    return sessions


@dataclass
class Timings:
    ttft: list[float] = field(default_factory=list)
    completion: list[float] = field(default_factory=list)
    errors: int = 0

    def extend(self, other: Timings) -> None:
        self.ttft += other.ttft
        self.completion += other.completion
        self.errors += other.errors


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def origin_of(url: str) -> str:
    """The origin of the page a websocket at `url` belongs to, as a browser sends it: the server
    accepts sockets only from its own scheme, host and port."""
    parts = urlsplit(url)
    return f"{'https' if parts.scheme == 'wss' else 'http'}://{parts.netloc}"


async def chat_client(
    url: str,
    *,
    cookie: str | None,
    until: float,
    timings: Timings,
    text: str = "Tell me about rivers.",
    lengths: Callable[[], int] | None = None,
    delay: float = 0.0,
) -> None:
    """Sends a message, reads the answer, and sends the next as soon as it ends, until `until`.
    The same code drives Sluice and the engine alone. `lengths`: each answer's length in
    tokens, asked of the simulated engine by a marker in the message (None: its own).
    `delay`: seconds to wait before connecting (a ramp, `ramp_delay`)."""
    import websockets

    await asyncio.sleep(delay)
    headers = {"Origin": origin_of(url), "Cookie": f"sessionid={cookie}"} if cookie else {}
    async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
        while time.perf_counter() < until:
            asked = text if lengths is None else f"{text} [[sim:tokens={lengths()}]]"
            sent = time.perf_counter()
            await ws.send(json.dumps({"type": "send", "text": asked}))
            first = None
            while True:
                frame = json.loads(await ws.recv())
                kind = frame["type"]
                if kind == "delta" and first is None:
                    first = time.perf_counter()
                elif kind == "final":
                    break
                elif kind == "error":
                    timings.errors += 1
                    await asyncio.sleep(0.05)
                    break
            if first is not None and kind == "final":
                done = time.perf_counter()
                timings.ttft.append((first - sent) * 1000)
                timings.completion.append((done - sent) * 1000)


def ramp_delay(n: int, clients: int, ramp: float) -> float:
    """When client `n` of `clients` starts: spread evenly over the first `ramp` seconds, so
    they connect and ask their first questions as people do, one after another, rather than all
    in the same millisecond (0: all at once)."""
    return ramp * n / clients if clients else 0.0


def print_row(label: str, clients: int, timings: Timings, seconds: float) -> None:
    rps = len(timings.completion) / seconds if seconds else 0
    say(
        f"{label:<8} {clients:>4} clients  ttft p50 {median(timings.ttft):7.1f} ms  "
        f"p99 {percentile(timings.ttft, 99):7.1f} ms  completion p50 "
        f"{median(timings.completion):7.1f} ms  {rps:6.1f} req/s  errors {timings.errors}"
    )
