"""A worker that leaves gives its private backlog (work routed to it for its KV cache) back to
the shared stream at once: on a clean stop before its running answers finish draining, and when
its heartbeat expires without waiting for it to be silent for a minute or for a claim timeout."""

from __future__ import annotations

import signal
import time

from contract import protocol, transitions
from contract.protocol import Keys, WorkItem
from core.redis_client import get_redis
from tests.conftest import wait_until
from tests.worker.conftest import enqueue, final_of


def submit(keys: Keys, request_id: str, stream: str) -> None:
    item = WorkItem(
        id=request_id,
        user_id="7",
        conversation_id="3",
        max_tokens=200,
        messages=[{"role": "user", "content": "hi"}],
    )
    pipe = get_redis().pipeline(transaction=False)
    transitions.submitted(
        pipe, keys, item, citations=[], stream=stream, submit_by_ms=protocol.now_ms() + 5000
    )
    pipe.execute()


def ids_on(stream: str) -> list[str]:
    return [fields["id"] for _, fields in get_redis().xrange(stream)]


def test_a_stopping_worker_hands_back_its_backlog_before_its_answers_drain(
    start_worker, redis_prefix
):
    keys = Keys(prefix=redis_prefix)
    private = keys.work_for("wl")
    # One slot, answers of about four seconds: one runs, three wait on its private stream.
    slow = ["--sim-decode-ms", "20", "--sim-first-token-ms", "5"]
    process = start_worker("wl", engine="simulated", slots=1, extra=slow)
    wait_until(lambda: get_redis().exists(keys.heartbeat("wl")), timeout=60, what="a heartbeat")
    for n in range(4):
        submit(keys, f"r{n}", private)
    wait_until(
        lambda: get_redis().hget(keys.request("r0"), "state") == "streaming",
        timeout=30,
        what="the first answer to start",
    )
    process.send_signal(signal.SIGTERM)
    wait_until(
        lambda: ids_on(keys.work) == ["r1", "r2", "r3"],
        timeout=5,
        what="the backlog on the shared stream",
    )
    assert get_redis().hget(keys.request("r0"), "state") == "streaming"  # still draining
    assert ids_on(private) == ["r0"]


async def test_a_vanished_workers_backlog_moves_as_soon_as_its_heartbeat_expires(
    run_worker, keys, redis_async
):
    private = keys.work_for("gone")
    for n in range(2):
        await enqueue(redis_async, keys, f"q{n}", stream=private)
    # It beat a moment ago, but its heartbeat key has expired: it is gone, not just quiet.
    await redis_async.zadd(keys.workers, {"gone": time.time() - 7})
    # A claim timeout of a minute: the backlog must not wait for it.
    await run_worker("live", claim_idle_ms=60_000)
    for n in range(2):
        assert (await final_of(redis_async, keys, f"q{n}", timeout=10))["state"] == "done"
    assert await redis_async.xlen(private) == 0
    assert await redis_async.zscore(keys.workers, "gone") is None  # nothing left of it


async def test_what_a_vanished_worker_had_read_waits_for_the_claim_timeout(
    run_worker, keys, redis_async
):
    private = keys.work_for("paused")
    await enqueue(redis_async, keys, "read", stream=private)
    await enqueue(redis_async, keys, "unread", stream=private)
    pipe = redis_async.pipeline(transaction=False)
    transitions.ensure_groups(pipe, [(private, protocol.WORKER_GROUP)])
    transitions.check_groups(await pipe.execute(raise_on_error=False))
    await redis_async.xreadgroup(protocol.WORKER_GROUP, "paused", {private: ">"}, count=1)
    await redis_async.zadd(keys.workers, {"paused": time.time() - 7})
    await run_worker("live", claim_idle_ms=1500)
    assert (await final_of(redis_async, keys, "unread", timeout=10))["state"] == "done"
    # Maybe only paused, and writing it: it moves once idle past the claim timeout.
    assert (await final_of(redis_async, keys, "read", timeout=15))["state"] == "done"
