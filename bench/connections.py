"""Redis connections held by one web process while it relays many live answers at once.

500 websocket clients each start a long answer (simulated engine); once every one of them is
receiving tokens, CLIENT LIST is read and the connections named after the web process's pid are
counted.

    .venv/bin/python bench/connections.py [--streams 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
    clients = redis.Redis.from_url(redis_url, decode_responses=True).client_list()
    web = [
        c
        for c in clients
        if c.get("name", "").endswith(f"-{web_pid}") or f"-{web_pid}-" in c.get("name", "")
    ]
    hold.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return len(web), counter[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=500)
    args = parser.parse_args()
    worker_args = [
        "--engine",
        "simulated",
        "--slots",
        str(args.streams + 10),
        "--sim-first-token-ms",
        "50",
        "--sim-decode-ms",
        "50",
        "--sim-tokens",
        "2000",
    ]
    with sluice(worker_args=worker_args) as running:
        setup_django()
        sessions = make_sessions(args.streams, prefix="conn")
        time.sleep(6)  # the worker's first heartbeat, the dispatcher's plan refresh
        count, live = asyncio.run(measure(running, sessions, running.env["REDIS_URL"]))
    print(f"connections: {count} redis connections for {live} streams")


if __name__ == "__main__":
    main()
