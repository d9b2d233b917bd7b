"""An answer's generation begun while its attempt's claim is on its way to Redis.

An attempt claims its request (transitions.start: the fencing token, the attempt's number)
before it may write anything, and that claim is a round trip. The engine needs the prompt
only, so for a work item's first delivery it starts as soon as the claim has been written to
Redis (CommandBatcher's `sent`), not when its reply comes back, and the round trip no longer
adds to the time to first token. Written first, the claim counts the attempt even if the
engine then kills the worker. Nothing generated is written before the claim has answered; a
claim that says not to run (stopped, ended already) drops the generation and frees the
engine's slot.

A redelivered work item (its worker died, or it was given back) waits for its claim's reply,
as every item once did: it may be the request that kills its workers, and the reply is what
stops it after its last attempt. So does every item where the connection cannot report its
writes (a Redis Cluster, TLS: worker/redis_connection.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from worker.engines import Engine, EngineOutput, EngineRequest


class EngineAhead:
    def __init__(self, engine: Engine, request: EngineRequest) -> None:
        self.engine = engine
        self.request = request
        self.started = time.perf_counter()
        self._outputs = engine.generate(request)
        self._first = asyncio.ensure_future(anext(self._outputs))
        self.taken = False  # its outputs went to the attempt, which now owns the generation
        self._dropped = False

    async def outputs(self) -> AsyncIterator[EngineOutput]:
        """The generation's outputs, the first of them already under way."""
        self.taken = True
        try:
            first = await self._first
        except StopAsyncIteration:
            return
        yield first
        async for output in self._outputs:
            yield output

    async def drop(self) -> None:
        """Stops the generation (the claim said not to run it, or the attempt ended before
        taking it); once only."""
        if self._dropped:
            return
        self._dropped = True
        await self.engine.abort(self.request.id)
        self._first.cancel()
        await asyncio.gather(self._first, return_exceptions=True)
        await self._outputs.aclose()
