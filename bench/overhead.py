"""What Sluice adds to a streamed answer: the simulated engine (first token after 50 ms, then
100 tokens 10 ms apart) through the whole service, and the same engine alone behind a bare
websocket, driven by the same client code, interleaved in one run. Each level also prints the
CPU every Sluice process spent per answer (web, dispatcher, worker, Redis, PostgreSQL, read
from /proc around the Sluice rounds).

    .venv/bin/python bench/overhead.py [--clients 1,10,100] [--seconds 8] [--rounds 2]
                                       [--web-processes 1] [--ops-page] [--lengths 50-150]
                                       [--ramp 1]

--ops-page keeps the admin's operations page open during the run, as a browser would: its live
part fetched every 2 s by a staff session, so the two runs tell what watching costs the service.

--lengths draws each answer's length (in tokens, on both sides alike): with every answer 100
tokens long, a level's answers end together and the next questions arrive in waves, the last of
each wave queued behind the others; varied lengths spread them out, as people's questions are.

--ramp starts the clients one after another over that many seconds (both sides alike): by
default all of a level's clients connect and ask in the same millisecond, so its first hundred
questions (and, with equal lengths, every later wave) queue behind one another, and that start
sets the p99; ramped, the figures are those of a hundred streams running side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import threading
import time

from harness import (
    BASE_DIR,
    Timings,
    chat_client,
    cpu_per_answer,
    make_sessions,
    median,
    percentile,
    print_row,
    process_cpu_seconds,
    ramp_delay,
    say,
    setup_django,
    sluice,
    wait_for_port,
)

from devstack.stack import free_port

ENGINE = {"first_token_ms": 50, "decode_ms": 10, "tokens": 100}


async def run_level(
    urls_and_cookies: list[tuple[str, str | None]],
    seconds: float,
    lengths: str = "",
    ramp: float = 0.0,
) -> Timings:
    """`lengths` "LOW-HIGH": each answer's length drawn between them (the same draws on both
    sides: each client's generator is seeded by its number); "": the engine's 100 tokens.
    `ramp`: the clients start one after another over this many seconds (harness.ramp_delay)."""
    timings = Timings()
    until = time.perf_counter() + seconds
    await asyncio.gather(
        *(
            chat_client(
                url,
                cookie=cookie,
                until=until,
                timings=timings,
                lengths=length_draws(lengths, seed=n),
                delay=ramp_delay(n, len(urls_and_cookies), ramp),
            )
            for n, (url, cookie) in enumerate(urls_and_cookies)
        )
    )
    return timings


def length_draws(lengths: str, *, seed: int):
    """A client's answer lengths: uniform between LOW and HIGH tokens."""
    if not lengths:
        return None
    low, high = (int(n) for n in lengths.split("-"))
    draw = random.Random(seed)
    return lambda: draw.randint(low, high)


def watch_ops_page(base_url: str, stop: threading.Event) -> None:
    """The operations page open in a browser: its live part fetched every 2 s, asking only for
    the samples it has not seen (as static/js/ops.js does)."""
    import httpx
    from django.contrib.auth.hashers import make_password
    from django.test import Client

    from apps.accounts.models import User

    staff = User.objects.create(
        username="bench-operator",
        is_staff=True,
        is_superuser=True,
        password=make_password("bench-password-1"),
    )
    client = Client()
    client.force_login(staff)
    cookies = {"sessionid": client.cookies["sessionid"].value}
    series = re.compile(r'id="ops-series-data"[^>]*>(.*?)</script>', re.S)
    since = ""
    with httpx.Client(base_url=base_url, cookies=cookies, timeout=10) as http:
        http.get("/admin/ops/")
        while not stop.wait(2.0):
            page = http.get("/admin/ops/live/", params={"since": since}).text
            found = series.search(page)
            if found:
                since = json.loads(found.group(1)).get("last") or since


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", default="1,10,100")
    parser.add_argument("--seconds", type=float, default=8.0, help="per round and side")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the two sides")
    parser.add_argument(
        "--web-processes",
        type=int,
        default=1,
        help="daphne processes, the clients spread over them",
    )
    parser.add_argument(
        "--ops-page",
        action="store_true",
        help="the ops page open (polled every 2 s) during the run",
    )
    parser.add_argument(
        "--lengths",
        default="",
        metavar="LOW-HIGH",
        help="answers of varied lengths (tokens), so they do not all end "
        "together: the steady state rather than waves",
    )
    parser.add_argument(
        "--ramp",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="the clients start one after another over this many seconds "
        "(both sides alike) instead of all at once",
    )
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]

    worker_args = [
        "--engine",
        "simulated",
        "--slots",
        str(max(levels) * 2),
        "--sim-first-token-ms",
        str(ENGINE["first_token_ms"]),
        "--sim-decode-ms",
        str(ENGINE["decode_ms"]),
        "--sim-tokens",
        str(ENGINE["tokens"]),
    ]
    direct_port = free_port()
    direct = subprocess.Popen(
        [
            sys.executable,
            str(BASE_DIR / "bench" / "direct_server.py"),
            "--port",
            str(direct_port),
            "--first-token-ms",
            str(ENGINE["first_token_ms"]),
            "--decode-ms",
            str(ENGINE["decode_ms"]),
            "--tokens",
            str(ENGINE["tokens"]),
        ]
    )
    try:
        wait_for_port(direct_port)
        with sluice(worker_args=worker_args, web_processes=args.web_processes) as running:
            setup_django()
            sessions = make_sessions(max(levels))
            time.sleep(6)  # the worker's first heartbeat, the dispatcher's plan refresh
            stop_watching = threading.Event()
            if args.ops_page:
                threading.Thread(
                    target=watch_ops_page, args=(running.base_url, stop_watching), daemon=True
                ).start()
            summary = {}
            cpu: dict[str, float] = {}
            for clients in levels:
                through, alone = Timings(), Timings()
                seconds_each = 0.0
                cpu = {}
                direct_cpu = 0.0  # the direct server's CPU, ms per answer
                for _ in range(args.rounds):
                    urls = running.ws_urls
                    sluice_clients = [
                        (f"{urls[n % len(urls)]}/ws/chat/{conversation}/", cookie)
                        for n, (cookie, conversation) in enumerate(sessions[:clients])
                    ]
                    direct_clients = [(f"ws://127.0.0.1:{direct_port}/", None)] * clients
                    before, answered = running.cpu_seconds(), len(through.completion)
                    calls_before = running.redis_calls()
                    through.extend(
                        asyncio.run(
                            run_level(sluice_clients, args.seconds, args.lengths, args.ramp)
                        )
                    )
                    done = len(through.completion) - answered
                    spent = cpu_per_answer(before, running.cpu_seconds(), done)
                    calls_after = running.redis_calls()
                    commands = {
                        name: (n - calls_before.get(name, 0)) / max(done, 1)
                        for name, n in calls_after.items()
                    }
                    cpu = {role: cpu.get(role, 0) + ms / args.rounds for role, ms in spent.items()}
                    direct_before, answered = process_cpu_seconds(direct.pid), len(alone.completion)
                    alone.extend(
                        asyncio.run(
                            run_level(direct_clients, args.seconds, args.lengths, args.ramp)
                        )
                    )
                    direct_spent = process_cpu_seconds(direct.pid) - direct_before
                    done = max(len(alone.completion) - answered, 1)
                    direct_cpu += direct_spent * 1000 / done / args.rounds
                    seconds_each += args.seconds
                print_row("sluice", clients, through, seconds_each)
                print_row("direct", clients, alone, seconds_each)
                shares = ", ".join(f"{role} {ms:.2f} ms" for role, ms in sorted(cpu.items()))
                say(f"  cpu per answer: {shares}")
                # The same engine behind a bare websocket, in one process: on a slow machine it
                # rises with Sluice's figure, so the ratio tells a change from the machine.
                say(
                    f"  direct server cpu per answer: {direct_cpu:.2f} ms (Sluice "
                    f"{sum(cpu.values()) / max(direct_cpu, 1e-9):.1f}x)"
                )
                busiest = sorted(commands.items(), key=lambda kv: -kv[1])[:8]
                say(
                    "  redis commands per answer (last round): "
                    + ", ".join(f"{name} {n:.1f}" for name, n in busiest)
                )
                summary[clients] = (through, alone, sum(cpu.values()))
            stop_watching.set()
    finally:
        direct.terminate()
        direct.wait()

    top = max(levels)
    through, alone, cpu_ms = summary[top]
    ttft50 = median(through.ttft) - median(alone.ttft)
    ttft99 = percentile(through.ttft, 99) - percentile(alone.ttft, 99)
    ratio = median(through.completion) / median(alone.completion)
    print(
        f"overhead: ttft +{ttft50:.1f} ms p50 / +{ttft99:.1f} ms p99, "
        f"completion time ratio {ratio:.3f}, cpu {cpu_ms:.1f} ms/answer"
    )


if __name__ == "__main__":
    main()
