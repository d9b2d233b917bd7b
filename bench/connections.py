"""Redis connections held by one web process while it relays many live answers at once.

N websocket clients each start a long answer (simulated engine: a token per --decode-ms per
stream, so 5,000 streams are 2,500 tokens a second through the one web process); once every one
of them is receiving tokens, CLIENT LIST is read and the connections named after the web
process's pid are counted. CLIENT LIST is also read every two seconds while the clients open,
and the most seen then is printed too: "constant" means at no moment more.

    .venv/bin/python bench/connections.py [--streams 500]
    .venv/bin/python bench/connections.py --cluster --streams 500 --streams 5000

With --cluster the same runs on a local 3-master Redis Cluster (devstack/cluster.py): the web
process's connections are counted on each master, for each number of streams.

Thousands of clients on one box: the open-files limit is raised to its hard limit (sockets are
files; the web process inherits it), and clients open a few dozen at a time, each waiting for
its first token before the next opens (daphne closes a websocket whose handshake waits past
5 s, which thousands of handshakes at once on two cores would).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import time
from collections import Counter

import redis
from harness import make_sessions, origin_of, say, setup_django, sluice

OPENING_AT_ONCE = 48  # clients between their handshake and their first token
HANDSHAKE_TRIES = 5
FIRST_TOKEN_WAIT = 300  # seconds: a stream not live by then counts as failed
retried = [0]  # handshakes tried again


async def open_stream(
    url: str, cookie: str, opening: asyncio.Semaphore, live: list[int], hold: asyncio.Event
) -> None:
    import websockets

    headers = {"Origin": origin_of(url), "Cookie": f"sessionid={cookie}"}
    async with opening:
        for attempt in range(HANDSHAKE_TRIES):
            try:
                ws = await websockets.connect(
                    url,
                    additional_headers=headers,
                    open_timeout=120,
                    ping_interval=None,
                    max_size=None,
                )
                break
            except (websockets.InvalidHandshake, OSError, TimeoutError):
                # daphne refuses a socket its application did not accept within 5 s (the
                # box was busy): the page would reconnect, and so does this client.
                if attempt == HANDSHAKE_TRIES - 1:
                    raise
                retried[0] += 1
                await asyncio.sleep(1 + attempt)
        await ws.send(json.dumps({"type": "send", "text": "A long answer, please."}))
        async with asyncio.timeout(FIRST_TOKEN_WAIT):
            while True:
                frame = json.loads(await ws.recv())
                if frame["type"] == "delta":
                    break
                if frame["type"] in ("final", "error"):
                    raise RuntimeError(f"stream ended early: {frame}")
    live[0] += 1
    async with ws:
        while not hold.is_set():  # keep reading: a client that stops reading stalls the web
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ws.recv(), timeout=1)


class Sampler:
    """The web process's connections on each node: now, and the most seen so far."""

    def __init__(self, redis_url: str, web_pid: int) -> None:
        self.redis_url, self.web_pid = redis_url, web_pid
        self.most_total: Counter = Counter()
        self.most_hub: Counter = Counter()

    def sample(self) -> dict[str, tuple[int, int]]:
        per_node = {}
        for address, clients in client_lists(self.redis_url).items():
            mine = [c for c in clients if _of_pid(c, self.web_pid)]
            hub = [c for c in mine if c.get("name", "").startswith("sluice-hub-")]
            per_node[address] = (len(mine), len(hub))
            self.most_total[address] = max(self.most_total[address], len(mine))
            self.most_hub[address] = max(self.most_hub[address], len(hub))
        return per_node

    async def run(self, every: float = 2.0) -> None:
        while True:
            await asyncio.to_thread(self.sample)
            await asyncio.sleep(every)


async def measure(running, sessions, redis_url: str) -> tuple[dict, Sampler, int, list[str]]:
    opening, hold = asyncio.Semaphore(OPENING_AT_ONCE), asyncio.Event()
    live = [0]
    retried[0] = 0
    sampler = Sampler(redis_url, running.pid_of("web"))
    sampling = asyncio.create_task(sampler.run())
    url = running.ws_url
    tasks = [
        asyncio.create_task(open_stream(f"{url}/ws/chat/{conv}/", cookie, opening, live, hold))
        for cookie, conv in sessions
    ]
    started, reported = time.perf_counter(), 0
    while live[0] + sum(t.done() for t in tasks) < len(tasks):
        if live[0] - reported >= 500:
            reported = live[0]
            say(f"{live[0]} streams live after {time.perf_counter() - started:.0f}s")
        await asyncio.sleep(0.5)
    failed = [repr(t.exception())[:200] for t in tasks if t.done() and t.exception()]
    say(
        f"{live[0]} streams live after {time.perf_counter() - started:.1f}s, "
        f"{retried[0]} handshakes tried again"
        + (f", {len(failed)} failed (first: {failed[0]})" if failed else "")
    )
    await asyncio.sleep(3)  # every stream relaying tokens for a while
    now = await asyncio.to_thread(sampler.sample)
    sampling.cancel()
    hold.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return now, sampler, live[0], failed


def _of_pid(client: dict, pid: int) -> bool:
    name = client.get("name", "")
    return name.endswith(f"-{pid}") or f"-{pid}-" in name


def client_lists(redis_url: str) -> dict[str, list[dict]]:
    """CLIENT LIST of the one Redis, or of each master of a cluster."""
    from contract import cluster

    if not cluster.is_cluster_url(redis_url):
        with redis.Redis.from_url(redis_url, decode_responses=True) as client:
            return {"redis": client.client_list()}
    client = cluster.sync_client(
        redis_url, decode_responses=True, max_connections=2, timeout=10, connect_timeout=5
    )
    try:
        return {node.name: client.client_list(target_nodes=node) for node in client.get_primaries()}
    finally:
        client.close()


def raise_open_files_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--streams",
        type=int,
        action="append",
        help="live streams (repeat for several runs; default 500)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="on a local 3-master Redis Cluster instead of one Redis",
    )
    parser.add_argument(
        "--decode-ms", type=int, default=2000, help="milliseconds between two tokens of one stream"
    )
    args = parser.parse_args()
    limit = raise_open_files_limit()
    counts = args.streams or [500]
    if max(counts) * 2 + 500 > limit:
        say(f"open-files limit {limit}: too low for {max(counts)} streams (2 sockets each)")
    with contextlib.ExitStack() as stack:
        from devstack.stack import VAR_DIR, embedded_postgres

        root = VAR_DIR / "bench" / f"connections-{os.getpid()}"
        stack.callback(shutil.rmtree, root, ignore_errors=True)  # last, once all is stopped
        if not os.environ.get("DATABASE_URL"):  # one database for every run: Django's settings
            os.environ["DATABASE_URL"] = stack.enter_context(embedded_postgres(root / "pg"))
        if args.cluster:
            from devstack.cluster import local_cluster

            os.environ["REDIS_URL"] = stack.enter_context(local_cluster(root / "redis")).url
        where = "on each of 3 masters" if args.cluster else "on one Redis"
        for streams in counts:
            now, sampler, live, failed = run(streams, args.decode_ms)
            total = [all_of for all_of, _ in now.values()]
            hub = [of_hub for _, of_hub in now.values()]
            most = [sampler.most_total[a] for a in now]
            print(
                f"connections: at most {max(total)} redis connections per node {where} "
                f"({', '.join(map(str, total))}), of which the output hub's at most "
                f"{max(hub)} ({', '.join(map(str, hub))}), for {live} live streams"
                f"{f' of {streams} ({len(failed)} failed)' if failed else ''}; "
                f"the most seen while they opened: {max(most)} ({', '.join(map(str, most))})",
                flush=True,
            )


def run(streams: int, decode_ms: int):
    worker_args = [
        "--engine",
        "simulated",
        "--slots",
        str(streams + 10),
        "--sim-first-token-ms",
        "50",
        "--sim-decode-ms",
        str(decode_ms),
        "--sim-tokens",
        "5000",
    ]
    # Each run's keys under a prefix of their own: the previous run's answers, still running
    # when its worker was stopped, are not this run's worker's to resume.
    with sluice(
        worker_args=worker_args, env_extra={"SLUICE_REDIS_PREFIX": f"conn{streams}"}
    ) as running:
        setup_django()
        sessions = make_sessions(streams, prefix=f"conn{streams}")
        time.sleep(6)  # the worker's first heartbeat, the dispatcher's plan refresh
        return asyncio.run(measure(running, sessions, running.env["REDIS_URL"]))


if __name__ == "__main__":
    main()
