"""Every open page reconnecting at once, as after a web process restarts: how long until all
of them are back, and what each socket's login costs the web.

A chat page holds two websockets (its chat and the user's inbox); N pages open 2N sockets in the
same instant, each with its own user's session cookie, and are closed again once all are open.
Daphne drops a websocket whose handshake waits past 5 s; Sluice answers one not opened within
4 s itself, closing it with 4503 "try again later" (apps/streams/handshake.py). Either way the
page tries again later, and both count as dropped here: a web process that takes longer than
that to log in a crowd loses part of it each time.

    .venv/bin/python bench/reconnect.py [--pages 300] [--rounds 3]

Last line, the rounds' means: `reconnect: <2N> sockets at once, all open in <ms> ms, handshake
p50 <ms> ms / p99 <ms> ms, dropped <n>, web cpu <ms> ms/socket`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from harness import (
    cpu_per_answer,
    make_sessions,
    median,
    origin_of,
    percentile,
    say,
    setup_django,
    sluice,
)

HANDSHAKE_TIMEOUT = 30  # the client waits longer than daphne: a dropped socket is daphne's doing
TRY_AGAIN_LATER = 4503  # accepted only to be closed at once: not open


async def open_all(pages: list[tuple[str, str]]) -> tuple[list[float], int]:
    """Opens every socket at once; their handshake times (ms) and how many failed."""
    import websockets

    times: list[float] = []

    async def one(url: str, cookie: str):
        started = time.perf_counter()
        headers = {"Origin": origin_of(url), "Cookie": f"sessionid={cookie}"}
        try:
            socket = await websockets.connect(
                url, additional_headers=headers, open_timeout=HANDSHAKE_TIMEOUT
            )
        except (OSError, TimeoutError, websockets.exceptions.WebSocketException):
            return None
        times.append((time.perf_counter() - started) * 1000)
        return socket

    sockets = await asyncio.gather(*(one(url, cookie) for url, cookie in pages))
    await asyncio.sleep(0.2)  # the close of a socket told to try again later has come by now
    refused = [s for s in sockets if s is not None and s.close_code == TRY_AGAIN_LATER]
    await asyncio.gather(*(s.close() for s in sockets if s is not None))
    return times, sum(1 for s in sockets if s is None) + len(refused)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    with sluice(worker_args=["--engine", "simulated", "--slots", "8"]) as running:
        setup_django()
        sockets = []
        for cookie, conversation in make_sessions(args.pages):
            sockets.append((f"{running.ws_url}/ws/chat/{conversation}/", cookie))
            sockets.append((f"{running.ws_url}/ws/inbox/", cookie))
        time.sleep(3)  # the worker's first heartbeat
        rounds = []
        for _ in range(args.rounds):
            cpu_before, started = running.cpu_seconds(), time.perf_counter()
            times, dropped = asyncio.run(open_all(sockets))
            wall_ms = (time.perf_counter() - started) * 1000
            cpu_ms = cpu_per_answer(cpu_before, running.cpu_seconds(), len(sockets))["web"]
            p50, p99 = (median(times), percentile(times, 99)) if times else (0.0, 0.0)
            rounds.append((wall_ms, p50, p99, dropped, cpu_ms))
            say(
                f"{len(sockets)} sockets: all open in {wall_ms:.0f} ms, handshake p50 "
                f"{p50:.0f} ms / p99 {p99:.0f} ms, dropped {dropped}, web cpu {cpu_ms:.2f} "
                "ms/socket"
            )
            time.sleep(2)  # the closes settle
    means = (statistics.fmean(column) for column in zip(*rounds, strict=True))
    wall_ms, p50, p99, dropped, cpu_ms = means
    print(
        f"reconnect: {len(sockets)} sockets at once, all open in {wall_ms:.0f} ms, handshake "
        f"p50 {p50:.0f} ms / p99 {p99:.0f} ms, dropped {dropped:.0f}, web cpu {cpu_ms:.2f} "
        "ms/socket"
    )


if __name__ == "__main__":
    main()
