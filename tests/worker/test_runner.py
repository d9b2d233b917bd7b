"""A worker in this process on the simulated engine: work answered, acknowledged and removed;
bad work dead-lettered while other work flows; a stopping worker hands its work on; a hung
answer fails and frees its slot; a vanished consumer group is recreated."""

from __future__ import annotations

from redis.exceptions import ResponseError

from contract import protocol
from tests.worker.conftest import (
    answer_records,
    blocked_in_read,
    enqueue,
    events,
    eventually,
    final_of,
)
from worker.engines.simulated import SimulatedEngine


async def test_a_work_item_is_answered_recorded_and_removed(run_worker, keys, redis_async):
    await run_worker()
    await enqueue(redis_async, keys, "r1")
    final = await final_of(redis_async, keys, "r1")
    assert (final["state"], final["text"]) == ("done", "tok0 tok1 tok2 tok3 tok4 ")
    assert (final["attempt"], final["finish_reason"]) == ("1", "length")  # ran to its cap
    kinds = [e["type"] for e in await events(redis_async, keys, "r1")]
    assert kinds[:2] == ["status", "start"] and kinds[-1] == "final" and "delta" in kinds
    records = await eventually(lambda: answer_records(redis_async, keys, "r1"), what="record")
    assert [r["state"] for r in records] == ["done"]
    # Acknowledged and deleted: the stream's length is work waiting or running, nothing else.
    await eventually(lambda: _empty(redis_async, keys.work), what="an empty work stream")


async def _empty(client, stream: str) -> bool:
    pending = await client.xpending(stream, protocol.WORKER_GROUP)
    return await client.xlen(stream) == 0 and pending["pending"] == 0


async def test_a_malformed_work_item_is_dead_lettered_while_others_flow(
    run_worker, keys, redis_async
):
    await run_worker()
    await redis_async.xadd(keys.work, {"v": "1", "id": "bad", "messages": "not json"})
    await enqueue(redis_async, keys, "good")
    assert (await final_of(redis_async, keys, "good"))["state"] == "done"
    dead = await eventually(lambda: redis_async.xrange(keys.dead), what="a dead letter")
    assert dead[0][1]["source"] == "worker" and "malformed" in dead[0][1]["reason"]
    assert dead[0][1]["request_id"] == "bad"
    await eventually(lambda: _empty(redis_async, keys.work), what="an empty work stream")


async def test_an_answer_past_its_time_limit_fails_and_frees_its_slot(
    run_worker, keys, redis_async
):
    engine = SimulatedEngine(
        slots=1, first_token_ms=5, decode_ms_per_token=2, tokens=5, faults=True
    )
    await run_worker(engine=engine, answer_timeout=0.5)
    await enqueue(redis_async, keys, "hung", text="[[sim:stall]]")
    await enqueue(redis_async, keys, "next")
    final = await final_of(redis_async, keys, "hung")
    assert final["state"] == "failed" and "took longer than" in final["error"]
    assert (await final_of(redis_async, keys, "next"))["state"] == "done"


async def test_work_read_just_as_the_worker_stops_goes_to_another_worker(
    run_worker, keys, redis_async
):
    worker = await run_worker(read_block_ms=3000)
    await eventually(
        lambda: blocked_in_read(redis_async, f"{keys.prefix}-{worker.worker_id}"),
        what="the worker to block in its read",
    )
    worker.stop()
    await enqueue(redis_async, keys, "late")
    await eventually(lambda: _stopped(redis_async, keys, worker.worker_id), what="the stop")
    state = await redis_async.hget(keys.request("late"), "state")
    assert state == "queued"  # never started by the draining worker
    await run_worker("w2")
    assert (await final_of(redis_async, keys, "late"))["state"] == "done"


async def _stopped(client, keys, worker_id: str) -> bool:
    return not await client.exists(keys.heartbeat(worker_id))


async def test_answers_still_running_past_the_grace_go_to_another_worker(
    run_worker, keys, redis_async
):
    slow = SimulatedEngine(slots=1, first_token_ms=5, decode_ms_per_token=100, tokens=40)
    worker = await run_worker(engine=slow, grace_seconds=0.3)
    await enqueue(redis_async, keys, "long")
    await eventually(lambda: _started(redis_async, keys, "long"), what="the first attempt")
    worker.stop()
    await eventually(lambda: _stopped(redis_async, keys, worker.worker_id), what="the stop")
    await run_worker("w2")
    final = await final_of(redis_async, keys, "long", timeout=30)
    assert (final["state"], final["attempt"]) == ("done", "2")
    starts = [e for e in await events(redis_async, keys, "long") if e["type"] == "start"]
    assert [s["worker"] for s in starts] == ["w1", "w2"]


async def _started(client, keys, request_id: str) -> bool:
    return any(e["type"] == "delta" for e in await events(client, keys, request_id))


async def test_a_consumer_group_that_vanished_is_recreated(run_worker, keys, redis_async):
    await run_worker()
    await enqueue(redis_async, keys, "before")
    await final_of(redis_async, keys, "before")
    await redis_async.delete(keys.work)  # the stream and its group are gone
    await eventually(lambda: _has_group(redis_async, keys.work), what="the group recreated")
    await enqueue(redis_async, keys, "after")
    assert (await final_of(redis_async, keys, "after"))["state"] == "done"


async def _has_group(client, stream: str) -> bool:
    try:
        groups = await client.xinfo_groups(stream)
    except ResponseError:  # no such stream
        return False
    return any(group["name"] == protocol.WORKER_GROUP for group in groups)
