"""Load benchmark: many concurrent users against a whole Sluice, as the background article's test
(1,000 users, 342 req/s, P99 2.3 s, 0.12 % errors), scaled to what two cores allow.

    .venv/bin/python bench/load.py                       # 1,000 users, 60 s, ~3 minutes
    .venv/bin/python bench/load.py --users 300 --think 10 --seconds 30

Starts --web web processes (websocket clients spread over them), the dispatcher pair (one holds
the lease, one stands by) and a simulated fleet of --gpus GPUs' worth of slots and speed in
--workers worker processes (first token 20 ms, 25 ms per token, 8 sequences per GPU). Users:
websocket clients, --sse-share of them on the HTTP API (POST, then the Server-Sent Events
stream, with an API key). Each user thinks (exponential, mean --think seconds), asks a question
(70 % simple: 12-32 answer tokens, 30 % complex: 80-160), waits for the whole answer, thinks
again. The offered rate is about users / (think + answer time).

Prints requests/s answered in the measured window, TTFT and completion p50/p99, the error rate
(error frames, failed answers, dropped connections) and each Sluice process's CPU per answer,
beside the article's figures. On two cores every process shares the machine with the clients:
the web is the limit, so the figure to improve is its CPU per request. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BASE_DIR), str(BASE_DIR / "bench")]

from harness import (  # noqa: E402
    cpu_per_answer,
    make_sessions,
    median,
    origin_of,
    percentile,
    say,
    setup_django,
    sluice,
)

ARTICLE = "article: 1000 users, 342 req/s, p99 2.3 s, 0.12 % errors (40 GPUs)"


def question(rng: random.Random) -> str:
    if rng.random() < 0.3:
        tokens = rng.randint(80, 160)
        return f"Explain in detail how sluice gates work, with trade-offs [[sim:tokens={tokens}]]"
    return f"What is a sluice? [[sim:tokens={rng.randint(12, 32)}]]"


class Tally:
    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end
        self.ttft: list[float] = []
        self.done: list[float] = []
        self.errors = 0
        self.asked = 0
        self.by_path = {"ws": 0, "sse": 0}
        self.reasons: Counter[str] = Counter()

    def ended(
        self, sent: float, first: float | None, ok: bool, path: str = "ws", reason: str = ""
    ) -> None:
        now = time.perf_counter()
        if not self.start <= now <= self.end:
            return
        self.asked += 1
        self.by_path[path] += ok
        if not ok:
            self.reasons[reason[:80] or "unknown"] += 1
        if not ok:
            self.errors += 1
            return
        self.done.append((now - sent) * 1000)
        if first is not None:
            self.ttft.append((first - sent) * 1000)


async def websocket_user(url: str, cookie: str, rng, args, tally: Tally) -> None:
    import websockets

    headers = {"Origin": origin_of(url), "Cookie": f"sessionid={cookie}"}
    await asyncio.sleep(rng.uniform(0, args.think))
    while time.perf_counter() < tally.end:
        try:
            async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
                while time.perf_counter() < tally.end:
                    sent, first, ok = time.perf_counter(), None, False
                    await ws.send(json.dumps({"type": "send", "text": question(rng)}))
                    while True:
                        frame = json.loads(await ws.recv())
                        if frame["type"] == "delta" and first is None:
                            first = time.perf_counter()
                        elif frame["type"] == "final":
                            ok = frame.get("state") == "done"
                            break
                        elif frame["type"] == "error":
                            break
                    why = frame.get("error") or frame.get("message") or frame.get("state", "")
                    tally.ended(sent, first, ok, "ws", str(why))
                    await asyncio.sleep(rng.expovariate(1 / args.think))
        except (OSError, websockets.WebSocketException) as exc:
            tally.ended(time.perf_counter(), None, False, "ws", f"connection: {exc}")
            await asyncio.sleep(1)


async def sse_user(
    http, base_url: str, api_key: str, conversation: int, rng, args, tally: Tally
) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    await asyncio.sleep(rng.uniform(0, args.think))
    while time.perf_counter() < tally.end:
        sent, first, ok, why = time.perf_counter(), None, False, ""
        try:
            body = {"text": question(rng), "conversation": conversation}
            created = await http.post(f"{base_url}/api/v1/requests", headers=headers, json=body)
            why = f"HTTP {created.status_code}"
            if created.status_code == 202:
                url = base_url + created.json()["events_url"]
                async with http.stream("GET", url, headers=headers) as events:
                    kind = ""
                    async for line in events.aiter_lines():
                        if line.startswith("event: "):
                            kind = line[7:]
                            if kind == "delta" and first is None:
                                first = time.perf_counter()
                        elif line.startswith("data: ") and kind in ("final", "error"):
                            data = json.loads(line[6:])
                            ok = kind == "final" and data.get("state") == "done"
                            why = str(data.get("error") or data.get("state") or kind)
                            break
        except Exception as exc:  # a dropped connection is an error the user sees
            ok, why = False, f"connection: {exc.__class__.__name__}"
        tally.ended(sent, first, ok, "sse", why)
        await asyncio.sleep(rng.expovariate(1 / args.think))


async def drive(running, sessions, api_users, args) -> Tally:
    import httpx

    start = time.perf_counter() + args.warmup
    tally = Tally(start, start + args.seconds)
    rng = random.Random(args.seed)
    urls = running.ws_urls
    tasks = [
        websocket_user(
            f"{urls[n % len(urls)]}/ws/chat/{conversation}/",
            cookie,
            random.Random(rng.random()),
            args,
            tally,
        )
        for n, (cookie, conversation) in enumerate(sessions)
    ]
    limits = httpx.Limits(max_connections=len(api_users) * 2 + 10)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        bases = [u.replace("ws://", "http://") for u in urls]
        tasks += [
            sse_user(
                http,
                bases[n % len(bases)],
                key,
                conversation,
                random.Random(rng.random()),
                args,
                tally,
            )
            for n, (key, conversation) in enumerate(api_users)
        ]
        runs = [asyncio.ensure_future(t) for t in tasks]
        await asyncio.sleep(args.warmup)
        before = running.cpu_seconds()
        await asyncio.sleep(args.seconds)
        after = running.cpu_seconds()
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
    tally.cpu = cpu_per_answer(before, after, len(tally.done))  # type: ignore[attr-defined]
    return tally


def api_keys(count: int) -> list[tuple[str, int]]:
    from apps.accounts.models import User
    from apps.accounts.services import api_key_create
    from apps.chat.services import conversation_create

    found = []
    for n in range(count):
        user = User.objects.create(username=f"load-api-{n}")
        _, raw = api_key_create(user=user, name="load")
        found.append((raw, conversation_create(owner=user, title="load").id))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--users", type=int, default=1000)
    add("--sse-share", type=float, default=0.1, help="share of users on the SSE API")
    add("--think", type=float, default=20.0, help="mean think time between questions, s")
    add("--seconds", type=float, default=60.0, help="measured window")
    add("--warmup", type=float, default=15.0)
    add("--web", type=int, default=2, help="web processes")
    add("--gpus", type=int, default=40, help="simulated GPUs (8 sequences each)")
    add("--workers", type=int, default=2, help="worker processes the GPUs are split over")
    add("--seed", type=int, default=11)
    args = parser.parse_args()
    api_count = int(args.users * args.sse_share)
    slots = args.gpus * 8 // args.workers
    sim = [
        "--engine",
        "simulated",
        "--slots",
        str(slots),
        "--sim-first-token-ms",
        "20",
        "--sim-decode-ms",
        "25",
        "--sim-batch-slowdown",
        "0",
    ]
    with sluice(worker_args=[*sim, "--worker-id", "load-w0"], web_processes=args.web) as running:
        supervisor, python = running.supervisor, sys.executable
        supervisor.start("dispatcher-2", [python, "manage.py", "run_dispatcher"])  # the standby
        for n in range(1, args.workers):
            supervisor.start(
                f"worker-{n}", [python, "-m", "worker", *sim, "--worker-id", f"load-w{n}"]
            )
        setup_django()
        say(f"creating {args.users} users ({api_count} on the API)")
        sessions = make_sessions(args.users - api_count, prefix="load")
        api_users = api_keys(api_count)
        say(f"{args.users} users for {args.seconds:.0f} s after {args.warmup:.0f} s warm-up")
        tally = asyncio.run(drive(running, sessions, api_users, args))
    report(tally, args)


def report(tally: Tally, args) -> None:
    rps = len(tally.done) / args.seconds
    errors = tally.errors / tally.asked * 100 if tally.asked else 0.0
    p99 = percentile(tally.done, 99) / 1000
    print(
        f"\nload: {args.users} users ({args.sse_share:.0%} SSE), think {args.think:g} s, "
        f"{args.web} web processes, {args.gpus} simulated GPUs"
    )
    print(
        f"answers {len(tally.done)} in {args.seconds:.0f} s: {rps:.1f} req/s; ttft p50 "
        f"{median(tally.ttft):.0f} ms p99 {percentile(tally.ttft, 99):.0f} ms; completion "
        f"p50 {median(tally.done) / 1000:.2f} s p99 {p99:.2f} s; errors {tally.errors}/"
        f"{tally.asked} (answers by websocket {tally.by_path['ws']}, by SSE "
        f"{tally.by_path['sse']})"
    )
    for reason, count in tally.reasons.most_common(3):
        print(f"  error x{count}: {reason}")
    cpu = tally.cpu  # type: ignore[attr-defined]
    print("cpu per answer: " + ", ".join(f"{role} {ms:.1f} ms" for role, ms in sorted(cpu.items())))
    print(ARTICLE)
    print(
        f"load: {args.users} users, {rps:.1f} req/s, p99 {p99:.2f} s, errors {errors:.2f} %, "
        f"web cpu {cpu.get('web', 0.0):.1f} ms/request"
    )


if __name__ == "__main__":
    main()
