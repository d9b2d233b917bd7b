"""A work item's first delivery starts the engine beside its claim (worker/ahead.py): a claim
that says not to run drops that generation and frees its slot, and a redelivered item (given
back, or reclaimed) never starts the engine before its claim has counted the attempt."""

from __future__ import annotations

from contract import protocol, transitions
from tests.worker.conftest import enqueue, events, eventually, final_of
from worker.engines.simulated import SimulatedEngine


class RecordingEngine(SimulatedEngine):
    """The simulated engine, noting each generation it began and each abort."""

    def __init__(self, **options) -> None:
        super().__init__(
            slots=1, first_token_ms=30, decode_ms_per_token=2, tokens=5, faults=True, **options
        )
        self.begun: list[str] = []
        self.aborted: list[str] = []

    async def generate(self, request):
        self.begun.append(request.id)
        async for output in super().generate(request):
            yield output

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        await super().abort(request_id)


async def test_a_stopped_request_drops_the_generation_begun_beside_its_claim(
    run_worker, keys, redis_async
):
    engine = RecordingEngine()
    await run_worker(engine=engine)
    pipe = redis_async.pipeline(transaction=False)
    transitions.stopped(pipe, keys, "stopped-early")  # Stop pressed before any worker took it
    await pipe.execute()
    await enqueue(redis_async, keys, "stopped-early")
    final = await final_of(redis_async, keys, "stopped-early")
    assert final["state"] == "cancelled"
    assert engine.begun[0] == "stopped-early" and "stopped-early" in engine.aborted
    kinds = [e["type"] for e in await events(redis_async, keys, "stopped-early")]
    assert "delta" not in kinds  # nothing it generated was written
    # Its one slot is free again: the next request is answered.
    await enqueue(redis_async, keys, "next")
    assert (await final_of(redis_async, keys, "next"))["state"] == "done"
    assert "next" not in engine.aborted
    assert len(engine._aborted) == 0  # no flag kept for the dropped generation


async def test_a_returned_item_of_an_exhausted_request_never_reaches_the_engine(
    run_worker, keys, redis_async
):
    engine = RecordingEngine()
    # The request as a dying worker left it: started three times, then given back.
    await enqueue(redis_async, keys, "poison", stream=keys.work + ":held")
    [(_, fields)] = await redis_async.xrange(keys.work + ":held")
    await redis_async.hset(keys.request("poison"), "attempt", 3)
    await redis_async.xadd(keys.work, {**fields, protocol.RETURNED: "1"})
    await run_worker(engine=engine, max_attempts=3)
    final = await final_of(redis_async, keys, "poison")
    assert final["state"] == "failed" and "tried 3 times" in final["error"]
    assert engine.begun == []
    dead = await eventually(lambda: redis_async.xrange(keys.dead), what="a dead letter")
    assert dead[0][1]["request_id"] == "poison"


async def test_a_first_delivery_is_answered_from_the_generation_begun_ahead(
    run_worker, keys, redis_async
):
    engine = RecordingEngine()
    await run_worker(engine=engine)
    await enqueue(redis_async, keys, "ahead")
    final = await final_of(redis_async, keys, "ahead")
    assert (final["state"], final["text"]) == ("done", "tok0 tok1 tok2 tok3 tok4 ")
    assert engine.begun == ["ahead"] and engine.aborted == []  # one generation, used
