"""Work nobody runs any more is run again (and work that runs is never taken for forgotten,
whatever its entry id): a paused worker's answer re-run elsewhere with its
late writes refused, a dead worker's routed work moved back without breaking its stream, work
that keeps killing its workers dead-lettered while other work flows, and work delivered to a
worker that forgot it run again."""

from __future__ import annotations

import time

from contract import protocol, transitions
from tests.worker.conftest import answer_records, enqueue, events, eventually, final_of
from worker.engines.simulated import SimulatedEngine


async def _as_consumer(client, keys, consumer: str, stream: str) -> tuple[str, dict]:
    """Delivers the next entry of `stream` to `consumer` (a worker that then goes quiet)."""
    pipe = client.pipeline(transaction=False)
    transitions.ensure_groups(pipe, [(stream, protocol.WORKER_GROUP)])
    transitions.check_groups(await pipe.execute(raise_on_error=False))
    response = await client.xreadgroup(protocol.WORKER_GROUP, consumer, {stream: ">"}, count=1)
    return response[0][1][0]


async def _write(client, queue):
    pipe = client.pipeline(transaction=False)
    queue(pipe)
    return (await pipe.execute())[0]


async def test_a_paused_workers_answer_runs_again_and_its_late_writes_are_refused(
    run_worker, keys, redis_async
):
    await enqueue(redis_async, keys, "r1")
    await _as_consumer(redis_async, keys, "paused", keys.work)
    # The paused worker had started and written some text, then stopped beating.
    await _write(
        redis_async,
        lambda p: transitions.start(p, keys, "r1", token="paused/1", worker_id="paused"),
    )
    await _write(
        redis_async,
        lambda p: transitions.delta(p, keys, "r1", token="paused/1", text="old ", batch=1),
    )
    await run_worker("live", claim_idle_ms=100)
    final = await final_of(redis_async, keys, "r1")
    assert (final["state"], final["attempt"]) == ("done", "2")
    # The paused worker resumes: every write it tries is refused, so readers see one answer.
    assert (
        await _write(
            redis_async,
            lambda p: transitions.delta(p, keys, "r1", token="paused/1", text="late ", batch=2),
        )
        == 0
    )
    answer = protocol.Answer(id="r1", user_id="7", conversation_id="3", state=protocol.State.DONE)
    reply = await _write(
        redis_async, lambda p: transitions.finish(p, keys, answer, token="paused/1")
    )
    assert transitions.finish_result(reply) == transitions.ALREADY_ENDED
    kinds = [e["type"] for e in await events(redis_async, keys, "r1")]
    assert kinds.count("final") == 1 and kinds.count("start") == 2
    assert "late " not in [e.get("text") for e in await events(redis_async, keys, "r1")]
    assert len(await answer_records(redis_async, keys, "r1")) == 1


async def test_a_dead_workers_routed_work_moves_back_and_its_stream_survives(
    run_worker, keys, redis_async
):
    private = keys.work_for("gone")
    await enqueue(redis_async, keys, "read", stream=private)
    await enqueue(redis_async, keys, "unread", stream=private)
    await _as_consumer(redis_async, keys, "gone", private)  # it had read one of the two
    await redis_async.zadd(keys.workers, {"gone": time.time() - 120})  # silent for 2 minutes
    await run_worker("live")
    for request_id in ("read", "unread"):
        assert (await final_of(redis_async, keys, request_id))["state"] == "done"
    # The stream and its group are kept: a worker that was only paused reads on, no NOGROUP.
    assert (
        await redis_async.xreadgroup(protocol.WORKER_GROUP, "gone", {private: ">"}, count=1) == []
    )
    assert await redis_async.xlen(private) == 0


async def test_work_that_keeps_killing_its_workers_is_dead_lettered_while_others_flow(
    run_worker, keys, redis_async
):
    await enqueue(redis_async, keys, "poison")
    await _as_consumer(redis_async, keys, "third-victim", keys.work)
    for victim in ("first", "second", "third"):  # three workers died running it
        await _write(
            redis_async,
            lambda p, v=victim: transitions.start(p, keys, "poison", token=f"{v}/1", worker_id=v),
        )
    await enqueue(redis_async, keys, "fine")
    await run_worker("live", claim_idle_ms=100, max_attempts=3)
    assert (await final_of(redis_async, keys, "fine"))["state"] == "done"
    final = await final_of(redis_async, keys, "poison")
    assert final["state"] == "failed" and "tried 3 times" in final["error"]
    dead = await eventually(lambda: redis_async.xrange(keys.dead), what="a dead letter")
    assert [d["request_id"] for _, d in dead] == ["poison"]
    assert "started 3 times" in dead[0][1]["reason"]
    assert [r["state"] for r in await answer_records(redis_async, keys, "poison")] == ["failed"]


async def test_work_delivered_to_a_worker_that_forgot_it_runs_again(run_worker, keys, redis_async):
    await enqueue(redis_async, keys, "r1")
    await _as_consumer(redis_async, keys, "w1", keys.work)  # delivered, then w1 restarted
    await run_worker("w1")
    assert (await final_of(redis_async, keys, "r1"))["state"] == "done"


async def test_entries_with_one_id_on_two_streams_each_run_once(run_worker, keys, redis_async):
    # The dispatcher's MULTI often gives entries on two streams the same id (one millisecond).
    for request_id, stream, text in (
        ("mine", keys.work_for("w1"), "five tokens"),
        ("shared", keys.work, "one [[sim:tokens=1]]"),
    ):
        await enqueue(redis_async, keys, request_id, text=text, stream=f"{keys.prefix}:staging")
        [(staged, fields)] = await redis_async.xrange(f"{keys.prefix}:staging")
        await redis_async.xdel(f"{keys.prefix}:staging", staged)
        await redis_async.xadd(stream, fields, id="1-1")
    slow = SimulatedEngine(slots=3, first_token_ms=5, decode_ms_per_token=250)  # 1 s, or 5 ms
    await run_worker("w1", engine=slow)
    for request_id in ("mine", "shared"):
        final = await final_of(redis_async, keys, request_id)
        assert (final["state"], final["attempt"]) == ("done", "1")  # never taken for forgotten
