"""A timing model of a GPU engine, for load benchmarks only; it never shows that a feature works.

Time to first token = `first_token_ms` + `prefill_ms_per_token` x uncached prompt tokens; then
one token every `decode_ms_per_token`, on a decode step shared by every running sequence (as on a
GPU, where one forward pass gives each sequence in the batch its next token). Both slow by
`batch_slowdown` per extra running sequence (continuous batching shares the GPU), and everything
by `1 / speed` (`speed` 0.5: a GPU half as fast as the others). A prefix cache keyed by the
leading messages remembers which prompt tokens are already computed, as vLLM's automatic prefix
caching would: a prefix counts only from the start of the prompt, and the cache holds at most
`kv_capacity_tokens`, least recently used evicted first.

With `faults` on, a marker in the last message makes the answer misbehave, so the fault tests
can drive what real engines do on a bad day: `[[sim:crash]]` kills the worker process,
`[[sim:stall]]` never yields a token, `[[sim:fail]]` raises. `fail_rate` and `stall_rate` make
that share of all answers fail or stall, at random (seeded), for the circuit breaker.

A benchmark sets an answer's length with `[[sim:tokens=N]]` in the last message (capped by
max_tokens), so answers vary as real ones do while max_tokens stays the same for all.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator

from contract.capabilities import refuse_missing
from worker.engines.base import AbortFlags, EngineHealth, EngineOutput, EngineRequest

LENGTH_MARKER = re.compile(r"\[\[sim:tokens=(\d+)\]\]")


def approx_tokens(text: str) -> int:
    return max(1, len(text) // 4)


class SimulatedEngine:
    name = "simulated"
    # Its text is a timing model's, not a model's: it can honour no response format, seed or
    # penalty, and says so rather than pretend.
    capabilities: frozenset[str] = frozenset()

    def __init__(
        self,
        *,
        slots: int = 64,
        first_token_ms: float = 50.0,
        decode_ms_per_token: float = 10.0,
        prefill_ms_per_token: float = 0.0,
        batch_slowdown: float = 0.0,
        tokens: int | None = None,
        prefix_cache_entries: int = 10_000,
        kv_capacity_tokens: int = 0,
        speed: float = 1.0,
        faults: bool = False,
        fail_rate: float = 0.0,
        stall_rate: float = 0.0,
        seed: int | None = None,
        context_tokens: int | None = None,
    ) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        if not (0 <= fail_rate <= 1 and 0 <= stall_rate <= 1):
            raise ValueError("fail and stall rates are shares between 0 and 1")
        self.slots = slots
        self.first_token_ms = first_token_ms
        self.decode_ms_per_token = decode_ms_per_token
        self.prefill_ms_per_token = prefill_ms_per_token
        self.batch_slowdown = batch_slowdown
        self.tokens = tokens  # fixed answer length; None = the request's max_tokens
        self.speed = speed
        # prefix hash → the tokens of its last message (what evicting it frees)
        self.prefix_cache: OrderedDict[int, int] = OrderedDict()
        self.prefix_cache_entries = prefix_cache_entries
        self.kv_capacity_tokens = kv_capacity_tokens  # 0: bounded by entries only
        self.kv_tokens = 0
        self.running = 0
        self._aborted = AbortFlags()
        self.cache_hits = 0
        self.cache_lookups = 0
        self.prompt_tokens = 0
        self.prompt_tokens_cached = 0
        self.busy_seconds = 0.0  # time with at least one sequence running
        self._busy_since = 0.0
        self.slot_seconds = 0.0  # running sequences integrated over time
        self._counted_at = time.perf_counter()
        self.faults = faults
        self.fail_rate = fail_rate
        self.stall_rate = stall_rate
        self.random = random.Random(seed)
        self.steps = DecodeSteps()
        self._context_tokens = context_tokens

    @property
    def capacity(self) -> int:
        return self.slots

    @property
    def context_tokens(self) -> int | None:
        return self._context_tokens

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def abort(self, request_id: str) -> None:
        self._aborted.abort(request_id)

    async def health(self) -> EngineHealth:
        rate = self.cache_hits / self.cache_lookups if self.cache_lookups else 0.0
        share = self.prompt_tokens_cached / self.prompt_tokens if self.prompt_tokens else 0.0
        busy = self.busy_seconds + (time.perf_counter() - self._busy_since if self.running else 0)
        return EngineHealth(
            ok=True,
            detail="simulated",
            metrics={
                "running": self.running,
                "waiting": 0,
                "kv_cache_usage": self.running / self.slots,
                "prefix_cache_hit_rate": round(rate, 3),
                "prefix_cache_token_share": round(share, 4),
                "prompt_tokens": self.prompt_tokens,
                "prompt_tokens_cached": self.prompt_tokens_cached,
                "busy_seconds": round(busy, 3),
                "slot_seconds": round(self._slot_seconds(), 3),
            },
        )

    def _slot_seconds(self) -> float:
        now = time.perf_counter()
        self.slot_seconds += self.running * (now - self._counted_at)
        self._counted_at = now
        return self.slot_seconds

    def _uncached_prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        total = 0
        cached = 0
        hit = True  # a prefix cache serves only an unbroken run from the prompt's start
        prefix = 0  # a running hash of the leading messages: one step per message, not a
        # repr of every prefix (that grows with the square of a long conversation)
        for message in messages:
            tokens = approx_tokens(message.get("content", ""))
            total += tokens
            prefix = hash((prefix, message.get("role"), message.get("content")))
            if hit and prefix in self.prefix_cache:
                self.prefix_cache.move_to_end(prefix)
                cached = total
                continue
            hit = False
            if prefix not in self.prefix_cache:
                self.prefix_cache[prefix] = tokens
                self.kv_tokens += tokens
            else:
                self.prefix_cache.move_to_end(prefix)
        while len(self.prefix_cache) > self.prefix_cache_entries or (
            self.kv_capacity_tokens and self.kv_tokens > self.kv_capacity_tokens
        ):
            self.kv_tokens -= self.prefix_cache.popitem(last=False)[1]
        self.cache_lookups += 1
        self.cache_hits += cached > 0
        self.prompt_tokens += total
        self.prompt_tokens_cached += cached
        return total - cached

    async def _misbehave(self, request: EngineRequest) -> None:
        last = request.messages[-1].get("content", "") if request.messages else ""
        if self.faults and "[[sim:crash]]" in last:
            os._exit(17)  # the whole worker process dies mid-answer, as on a driver fault
        draw = self.random.random()
        if (self.faults and "[[sim:stall]]" in last) or draw < self.stall_rate:
            await asyncio.Event().wait()
        if (self.faults and "[[sim:fail]]" in last) or (
            self.stall_rate <= draw < self.stall_rate + self.fail_rate
        ):
            raise RuntimeError("simulated engine failure")

    def _slowed(self, ms: float) -> float:
        return ms * (1 + self.batch_slowdown * (self.running - 1)) / self.speed

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        refuse_missing(request, self.capabilities)
        await self._misbehave(request)
        prompt_tokens = sum(approx_tokens(m.get("content", "")) for m in request.messages)
        uncached = self._uncached_prompt_tokens(request.messages)
        cached = prompt_tokens - uncached  # reported with each output, as vLLM reports it
        # A fixed length ends on its own ("stop") unless the request's cap comes first.
        marker = LENGTH_MARKER.search(request.messages[-1].get("content", ""))
        tokens = int(marker.group(1)) if marker else self.tokens
        count = request.max_tokens if tokens is None else min(tokens, request.max_tokens)
        natural_end = "length" if count == request.max_tokens else "stop"
        with self._aborted.running(request.id):
            if not self.running:
                self._busy_since = time.perf_counter()
            self._slot_seconds()
            self.running += 1
            try:
                start = time.perf_counter()
                prefill = self.first_token_ms + self.prefill_ms_per_token * uncached
                await _sleep_until(start, self._slowed(prefill))
                for i in range(count):
                    if request.id in self._aborted:
                        yield EngineOutput("", prompt_tokens, i, "abort", cached)
                        return
                    if i:
                        await self.steps.next(self._slowed(self.decode_ms_per_token) / 1000)
                    token = f"tok{i} "
                    if request.stop and any(s in token for s in request.stop):
                        yield EngineOutput("", prompt_tokens, i, "stop", cached)  # as engines do
                        return
                    last = i == count - 1
                    end = natural_end if last else None
                    yield EngineOutput(token, prompt_tokens, i + 1, end, cached)
            finally:
                self._slot_seconds()
                self.running -= 1
                if not self.running:
                    self.busy_seconds += time.perf_counter() - self._busy_since


class DecodeSteps:
    """The engine's decode steps: every sequence waiting for its next token wakes on the same
    tick, one timer for the whole batch rather than one per token of each answer (100 answers
    at 10 ms a token were 10,000 timers a second, a large part of a benchmark worker's CPU).
    Ticks keep their cadence from the previous one while the batch runs, so timer lag does not
    stretch an answer; a tick with nobody waiting is not scheduled."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future] = []
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the timer's (tests run several)
        self._last_tick = float("-inf")  # the loop time the previous tick was due at

    def next(self, period: float) -> asyncio.Future:
        """A future done at the next tick, `period` seconds after the previous one (or from
        now, when the batch was idle for longer)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a timer left on a closed loop would never fire
            self._loop, self._timer, self._waiters = loop, None, []
            self._last_tick = float("-inf")
        waiter = loop.create_future()  # its own: one cancelled waiter leaves the others be
        self._waiters.append(waiter)
        if self._timer is None:
            due = self._last_tick + period
            if due < loop.time():
                due = loop.time() + period
            self._timer = loop.call_at(due, self._tick, due)
        return waiter

    def _tick(self, due: float) -> None:
        self._timer = None
        self._last_tick = due
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


async def _sleep_until(start: float, delay_ms: float) -> None:
    """Sleeps to an absolute deadline so timer slack does not accumulate over 100 tokens."""
    remaining = start + delay_ms / 1000 - time.perf_counter()
    if remaining > 0:
        await asyncio.sleep(remaining)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sim = parser.add_argument_group("simulated (benchmarks only)")
    add = sim.add_argument
    add("--sim-first-token-ms", type=float, default=50.0)
    add("--sim-decode-ms", type=float, default=10.0)
    add(
        "--sim-prefill-ms-per-token",
        type=float,
        default=0.0,
        help="prefill cost per prompt token the prefix cache does not hold",
    )
    add(
        "--sim-batch-slowdown",
        type=float,
        default=0.0,
        help="each extra running sequence slows prefill and decode by this share",
    )
    add(
        "--sim-kv-tokens",
        type=int,
        default=0,
        help="prefix-cache capacity in tokens, least recently used evicted (0: unbounded)",
    )
    add(
        "--sim-speed",
        type=float,
        default=1.0,
        help="relative speed of this GPU (0.5: every step takes twice as long)",
    )
    add(
        "--sim-faults",
        action="store_true",
        help="markers in a message make its answer crash the worker, stall or fail (tests)",
    )
    add("--sim-fail-rate", type=float, default=0.0, help="share of answers that fail at random")
    add(
        "--sim-stall-rate",
        type=float,
        default=0.0,
        help="share of answers that never produce a token (the answer timeout ends them)",
    )
    add("--sim-seed", type=int, default=None, help="seed of the fail/stall draws")
    add(
        "--sim-context-tokens",
        type=int,
        default=None,
        help="the context window the worker reports (default: none, as the openai engine)",
    )
    add(
        "--sim-tokens",
        type=int,
        default=None,
        help="fixed answer length (default: the request's max_tokens)",
    )


def options_from_args(args: argparse.Namespace, slots: int | None) -> dict:
    return {
        "slots": slots or 64,
        "first_token_ms": args.sim_first_token_ms,
        "decode_ms_per_token": args.sim_decode_ms,
        "prefill_ms_per_token": args.sim_prefill_ms_per_token,
        "batch_slowdown": args.sim_batch_slowdown,
        "kv_capacity_tokens": args.sim_kv_tokens,
        "speed": args.sim_speed,
        "tokens": args.sim_tokens,
        "faults": args.sim_faults,
        "fail_rate": args.sim_fail_rate,
        "stall_rate": args.sim_stall_rate,
        "seed": args.sim_seed,
        "context_tokens": args.sim_context_tokens,
    }
