"""A timing model of a GPU engine, for load benchmarks only; it never shows that a feature works.

Time to first token = `first_token_ms` + `prefill_ms_per_token` x uncached prompt tokens; then
one token every `decode_ms_per_token`, slowed by `batch_slowdown` per extra running sequence
(continuous batching shares the GPU). A prefix cache keyed by the leading messages remembers how
many prompt tokens are already computed, as vLLM's automatic prefix caching would.

With `faults` on, a marker in the last message makes the answer misbehave, so the fault tests
can drive what real engines do on a bad day: `[[sim:crash]]` kills the worker process,
`[[sim:stall]]` never yields a token, `[[sim:fail]]` raises.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator

from .base import EngineHealth, EngineOutput, GenerationRequest


def approx_tokens(text: str) -> int:
    return max(1, len(text) // 4)


class SimulatedEngine:
    name = "simulated"

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
        faults: bool = False,
    ) -> None:
        self.slots = slots
        self.first_token_ms = first_token_ms
        self.decode_ms_per_token = decode_ms_per_token
        self.prefill_ms_per_token = prefill_ms_per_token
        self.batch_slowdown = batch_slowdown
        self.tokens = tokens  # fixed answer length; None = the request's max_tokens
        self.prefix_cache: OrderedDict[int, int] = OrderedDict()
        self.prefix_cache_entries = prefix_cache_entries
        self.running = 0
        self._aborted: set[str] = set()
        self.cache_hits = 0
        self.cache_lookups = 0
        self.faults = faults

    @property
    def capacity(self) -> int:
        return self.slots

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    async def health(self) -> EngineHealth:
        rate = self.cache_hits / self.cache_lookups if self.cache_lookups else 0.0
        return EngineHealth(ok=True, detail="simulated", metrics={
            "running": self.running, "waiting": 0, "kv_cache_usage": self.running / self.slots,
            "prefix_cache_hit_rate": round(rate, 3),
        })  # fmt: skip

    def _uncached_prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        total = 0
        cached = 0
        prefix = 0  # a running hash of the leading messages: one step per message, not a
        # repr of every prefix (that grows with the square of a long conversation)
        for message in messages:
            total += approx_tokens(message.get("content", ""))
            prefix = hash((prefix, message.get("role"), message.get("content")))
            if prefix in self.prefix_cache:
                self.prefix_cache.move_to_end(prefix)
                cached = total
            else:
                self.prefix_cache[prefix] = total
        while len(self.prefix_cache) > self.prefix_cache_entries:
            self.prefix_cache.popitem(last=False)
        self.cache_lookups += 1
        self.cache_hits += cached > 0
        return total - cached

    async def _misbehave(self, request: GenerationRequest) -> None:
        last = request.messages[-1].get("content", "") if request.messages else ""
        if "[[sim:crash]]" in last:
            os._exit(17)  # the whole worker process dies mid-answer, as on a driver fault
        if "[[sim:stall]]" in last:
            await asyncio.Event().wait()
        if "[[sim:fail]]" in last:
            raise RuntimeError("simulated engine failure")

    async def generate(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        if self.faults:
            await self._misbehave(request)
        prompt_tokens = sum(approx_tokens(m.get("content", "")) for m in request.messages)
        uncached = self._uncached_prompt_tokens(request.messages)
        # A fixed length ends on its own ("stop") unless the request's cap comes first.
        count = request.max_tokens if self.tokens is None else min(self.tokens, request.max_tokens)
        natural_end = "length" if count == request.max_tokens else "stop"
        self.running += 1
        try:
            start = time.perf_counter()
            await _sleep_until(start, self.first_token_ms + self.prefill_ms_per_token * uncached)
            deadline = time.perf_counter()
            for i in range(count):
                if request.id in self._aborted:
                    self._aborted.discard(request.id)
                    yield EngineOutput("", prompt_tokens, i, "abort")
                    return
                if i:
                    step = self.decode_ms_per_token * (1 + self.batch_slowdown * (self.running - 1))
                    deadline += step / 1000
                    await _sleep_until(deadline, 0)
                token = f"tok{i} "
                if request.stop and any(s in token for s in request.stop):
                    yield EngineOutput("", prompt_tokens, i, "stop")  # as engines do: unsent
                    return
                last = i == count - 1
                yield EngineOutput(token, prompt_tokens, i + 1, natural_end if last else None)
        finally:
            self.running -= 1


async def _sleep_until(start: float, delay_ms: float) -> None:
    """Sleeps to an absolute deadline so timer slack does not accumulate over 100 tokens."""
    remaining = start + delay_ms / 1000 - time.perf_counter()
    if remaining > 0:
        await asyncio.sleep(remaining)
