"""Work and dead letters left under the fleet's old key names move to the current ones when a
worker starts, and the work is answered."""

from __future__ import annotations

import json

from contract import protocol
from contract.protocol import State
from tests.worker.conftest import enqueue, final_of
from worker import legacy_keys


async def test_a_starting_worker_moves_old_work_and_dead_letters_and_answers_the_work(
    redis_async, keys, run_worker
):
    item = await enqueue(redis_async, keys, "req-old", stream=keys.legacy_work)
    routed = await enqueue(redis_async, keys, "req-routed", stream=f"{keys.prefix}:work:old-w1")
    await redis_async.xadd(keys.legacy_dead, {"request_id": "gone", "reason": "kept for you"})
    assert await redis_async.xlen(keys.legacy_work) == 1

    await run_worker("w1")

    for request_id in (item.id, routed.id):
        assert (await final_of(redis_async, keys, request_id))["state"] == State.DONE
    for old in (keys.legacy_work, f"{keys.prefix}:work:old-w1", keys.legacy_dead):
        assert not await redis_async.exists(old)
    dead = [f for _, f in await redis_async.xrange(keys.dead)]
    assert dead == [{"request_id": "gone", "reason": "kept for you"}]


async def test_moving_twice_moves_nothing_more(redis_async, keys):
    await enqueue(redis_async, keys, "req-once", stream=keys.legacy_work)
    assert await legacy_keys.move_legacy_entries(redis_async, keys) == 1
    assert await legacy_keys.move_legacy_entries(redis_async, keys) == 0
    moved = [f for _, f in await redis_async.xrange(keys.work)]
    assert [f["id"] for f in moved] == ["req-once"]
    assert moved[0][protocol.RETURNED] == "1"
    assert json.loads(moved[0]["messages"])[0]["content"] == "Hi"
