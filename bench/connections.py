"""Redis connections held by one web process while it relays many live answers at once.

500 websocket clients each start a long answer (simulated engine); once every one of them is
receiving tokens, CLIENT LIST is read and the connections named after the web process's pid are
counted.

    .venv/bin/python bench/connections.py [--streams 500]
    .venv/bin/python bench/connections.py --cluster --streams 500 --streams 5000

With --cluster the same runs on a local 3-master Redis Cluster (chatsite/cluster.py): the web
process's connections are counted on each master, for each number of streams.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time

import redis
from harness import make_sessions, origin_of, say, setup_django, sluice


async def open_stream(
    url: str,
    cookie: str,
    receiving: asyncio.Event,
    counter: list[int],
    total: int,
    hold: asyncio.Event,
) -> None:
    import websockets

    headers = {"Origin": origin_of(url), "Cookie": f"sessionid={cookie}"}
    async with websockets.connect(url, additional_headers=headers, open_timeout=60) as ws:
        await ws.send(json.dumps({"type": "send", "text": "A long answer, please."}))
        while True:
            frame = json.loads(await ws.recv())
            if frame["type"] == "delta":
                break
            if frame["type"] in ("final", "error"):
                raise RuntimeError(f"stream ended early: {frame}")
        counter[0] += 1
        if counter[0] == total:
            receiving.set()
        await hold.wait()


async def measure(running, sessions, redis_url: str) -> tuple[int, int]:
    receiving, hold = asyncio.Event(), asyncio.Event()
    counter = [0]
    tasks = [
        asyncio.create_task(
            open_stream(
                f"{running.ws_url}/ws/chat/{conv}/", cookie, receiving, counter, len(sessions), hold
            )
        )
        for cookie, conv in sessions
    ]
    started = time.perf_counter()
    while not receiving.is_set():
        for task in tasks:
            if task.done() and task.exception():
                raise task.exception()
        await asyncio.sleep(0.2)
    say(f"{len(sessions)} streams live after {time.perf_counter() - started:.1f}s")
    web_pid = running.pid_of("web")
    per_node = {}
    for address, clients in client_lists(redis_url).items():
        mine = [c for c in clients if _of_pid(c, web_pid)]
        hub = [c for c in mine if c.get("name", "").startswith("sluice-hub-")]
        per_node[address] = (len(mine), len(hub))
    hold.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return per_node, counter[0]


def _of_pid(client: dict, pid: int) -> bool:
    name = client.get("name", "")
    return name.endswith(f"-{pid}") or f"-{pid}-" in name


def client_lists(redis_url: str) -> dict[str, list[dict]]:
    """CLIENT LIST of the one Redis, or of each master of a cluster."""
    from worker import cluster

    if not cluster.is_cluster_url(redis_url):
        return {"redis": redis.Redis.from_url(redis_url, decode_responses=True).client_list()}
    client = cluster.sync_client(redis_url, decode_responses=True, max_connections=2,
                                 timeout=10, connect_timeout=5)  # fmt: skip
    return {node.name: client.client_list(target_nodes=node) for node in client.get_primaries()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, action="append",
                        help="live streams (repeat for several runs; default 500)")  # fmt: skip
    parser.add_argument("--cluster", action="store_true",
                        help="on a local 3-master Redis Cluster instead of one Redis")  # fmt: skip
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if args.cluster:
            from chatsite.cluster import local_cluster
            from chatsite.stack import VAR_DIR

            nodes = stack.enter_context(local_cluster(VAR_DIR / "bench" / "cluster"))
            os.environ["REDIS_URL"] = nodes.url
        for streams in args.streams or [500]:
            count, live = run(streams)
            where = "on each of 3 masters" if args.cluster else "on one Redis"
            total = [all_of for all_of, _ in count.values()]
            hub = [of_hub for _, of_hub in count.values()]
            print(
                f"connections: at most {max(total)} redis connections per node {where} "
                f"({', '.join(map(str, total))}), of which the output hub's at most "
                f"{max(hub)} ({', '.join(map(str, hub))}), for {live} streams",
                flush=True,
            )


def run(streams: int) -> tuple[dict[str, tuple[int, int]], int]:
    worker_args = [
        "--engine",
        "simulated",
        "--slots",
        str(streams + 10),
        "--sim-first-token-ms",
        "50",
        "--sim-decode-ms",
        "50",
        "--sim-tokens",
        "2000",
    ]
    with sluice(worker_args=worker_args) as running:
        setup_django()
        sessions = make_sessions(streams, prefix=f"conn{streams}")
        time.sleep(6)  # the worker's first heartbeat, the dispatcher's plan refresh
        return asyncio.run(measure(running, sessions, running.env["REDIS_URL"]))


if __name__ == "__main__":
    main()
