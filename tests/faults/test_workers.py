"""Workers that die, pause, stop or meet poison: every accepted request still ends once."""

from __future__ import annotations

import signal
import time

from contract.protocol import Keys
from tests.faults.conftest import assert_every_request_ended, output_texts, wait_until


def _running_on(stack, worker_id: str, request_ids: list[str]) -> list[str]:
    keys = Keys(prefix=stack.env["SLUICE_REDIS_PREFIX"])
    client = stack.redis_server.client()
    found = []
    for request_id in request_ids:
        state, worker = client.hmget(keys.request(request_id), "state", "worker")
        if state == "streaming" and worker == worker_id:
            found.append(request_id)
    return found


def _beats_since(stack, worker_id: str, since_ms: float, *, running_none_of: list[str]) -> bool:
    """A heartbeat of the worker written after `since_ms`, with none of those requests running."""
    beat = stack.heartbeat(worker_id)
    return (
        beat is not None
        and beat["at_ms"] >= since_ms
        and not set(beat["running"]) & set(running_none_of)
    )


def _one_clean_answer(stack, request_id: str) -> None:
    """What a reader saw: after the last start, the deltas of that attempt only, then the final
    event holding exactly that text, and nothing after it."""
    events = output_texts(stack, request_id)
    kinds = [kind for kind, _ in events]
    assert kinds.count("final") == 1 and kinds[-1] == "final", kinds
    last_start = max(i for i, kind in enumerate(kinds) if kind == "start")
    streamed = "".join(text for kind, text in events[last_start:] if kind == "delta")
    assert streamed == events[-1][1]


def test_a_worker_killed_mid_answer_is_replaced_and_each_answer_stored_once(
    stack, roomy_plan, make_api
):
    base = stack.up({"w1": 3, "w2": 3})
    api = make_api("alice", base)
    ids = [api.submit() for _ in range(6)]
    wait_until(lambda: _running_on(stack, "w1", ids), what="an answer streaming on w1")
    stack.signal("w1", signal.SIGKILL)
    ended = assert_every_request_ended(api, stack, ids)
    assert set(ended.values()) == {"done"}
    for request_id in ids:
        _one_clean_answer(stack, request_id)


def test_a_paused_worker_is_replaced_and_on_resume_neither_crashes_nor_writes(
    stack, roomy_plan, make_api
):
    base = stack.up({"w1": 3, "w2": 3})
    api = make_api("alice", base)
    ids = [api.submit() for _ in range(6)]
    paused = wait_until(lambda: _running_on(stack, "w1", ids), what="answers on w1")
    stack.signal("w1", signal.SIGSTOP)
    # Taken for dead (heartbeat gone, work idle past the claim time), its answers run again.
    ended = assert_every_request_ended(api, stack, ids)
    assert set(ended.values()) == {"done"}
    resumed_ms = time.time() * 1000
    stack.signal("w1", signal.SIGCONT)
    # It resumes mid-answer, finds its claims gone, and carries on: it beats again, running
    # none of the answers it had.
    wait_until(
        lambda: _beats_since(stack, "w1", resumed_ms, running_none_of=paused),
        timeout=30,
        what="w1 to beat again without its old answers",
    )
    assert stack.processes["w1"].poll() is None, stack.log("w1")
    for request_id in ids:
        _one_clean_answer(stack, request_id)
    assert all(len([k for k, _ in output_texts(stack, r) if k == "start"]) == 2 for r in paused)
    more = [api.submit() for _ in range(6)]
    assert set(assert_every_request_ended(api, stack, more).values()) == {"done"}


def test_a_stopping_worker_takes_no_new_work_and_hands_on_what_it_cannot_finish(
    stack, roomy_plan, make_api
):
    base = stack.up({"w2": 8})
    stack.worker("w1", slots=4, extra=("--grace", "0.5"))
    stack.wait_for_workers("w1")
    api = make_api("alice", base)
    # More than w2's 8 slots: whichever worker Redis serves first, some must run on w1.
    ids = [api.submit() for _ in range(12)]
    wait_until(lambda: _running_on(stack, "w1", ids), what="answers on w1")
    stack.signal("w1", signal.SIGTERM)
    # Its heartbeat says it drains (no more work is routed to it, and what it reads it hands
    # back), or it has already gone.
    wait_until(
        lambda: (beat := stack.heartbeat("w1")) is None or beat["draining"],
        timeout=30,
        what="w1 to say it drains",
    )
    later = [api.submit() for _ in range(4)]
    ended = assert_every_request_ended(api, stack, ids + later)
    assert set(ended.values()) == {"done"}  # none failed for want of a grace period
    assert stack.processes["w1"].wait(timeout=30) == 0
    keys = Keys(prefix=stack.env["SLUICE_REDIS_PREFIX"])
    client = stack.redis_server.client()
    for request_id in later:  # sent after the stop: only the other worker ran them
        assert client.hget(keys.request(request_id), "worker") == "w2"


def test_work_that_kills_every_worker_fails_visibly_while_other_work_flows(
    stack, roomy_plan, make_api
):
    base = stack.up({"w1": 2, "w2": 2, "w3": 2, "w4": 2})
    api = make_api("alice", base)
    poison = api.submit("[[sim:crash]] this question kills the worker that runs it")
    fine = [api.submit() for _ in range(4)]
    ended = assert_every_request_ended(api, stack, [poison, *fine], timeout=120)
    assert ended[poison] == "failed"
    assert {ended[i] for i in fine} == {"done"}
    keys = Keys(prefix=stack.env["SLUICE_REDIS_PREFIX"])
    client = stack.redis_server.client()
    final = next(f for _, f in client.xrange(keys.output(poison)) if f["type"] == "final")
    assert "tried 3 times" in final["error"]
    dead = [f for _, f in client.xrange(keys.dead)]
    assert [d["request_id"] for d in dead] == [poison]
    # Three workers died on it; the fourth refused to run it a fourth time and lives on.
    survivors = [n for n in ("w1", "w2", "w3", "w4") if stack.processes[n].poll() is None]
    assert len(survivors) == 1


def test_an_answer_that_ran_beside_poison_is_rerun_alone_and_never_dead_lettered(
    stack, roomy_plan, make_api
):
    base = stack.up({"w1": 2})
    api = make_api("alice", base)
    neighbour = api.submit()
    wait_until(lambda: _running_on(stack, "w1", [neighbour]), what="an answer streaming on w1")
    poison = api.submit("[[sim:crash]] this question kills the worker that runs it")
    wait_until(lambda: stack.processes["w1"].poll() is not None, what="w1 to die on the poison")
    # Both were pending on w1 when it died: nobody can tell which one killed it. Each of the
    # next workers could take both at once; each runs one alone.
    for name in ("w2", "w3", "w4"):
        stack.worker(name, slots=2)
    ended = assert_every_request_ended(api, stack, [neighbour, poison], timeout=120)
    assert ended == {neighbour: "done", poison: "failed"}
    starts = [k for k, _ in output_texts(stack, neighbour) if k == "start"]
    assert len(starts) == 2  # beside the poison, then alone
    _one_clean_answer(stack, neighbour)
    keys = Keys(prefix=stack.env["SLUICE_REDIS_PREFIX"])
    client = stack.redis_server.client()
    assert [f["request_id"] for _, f in client.xrange(keys.dead)] == [poison]


def test_a_malformed_work_entry_is_dead_lettered_and_holds_up_nothing(stack, roomy_plan, make_api):
    base = stack.up({"w1": 1})
    keys = Keys(prefix=stack.env["SLUICE_REDIS_PREFIX"])
    client = stack.redis_server.client()
    client.xadd(keys.work, {"v": "1", "id": "poison", "messages": "[not json"})
    api = make_api("alice", base)
    ids = [api.submit() for _ in range(5)]
    assert set(assert_every_request_ended(api, stack, ids).values()) == {"done"}
    assert [f["request_id"] for _, f in client.xrange(keys.dead)] == ["poison"]
    assert client.xlen(keys.work) == 0  # deleted, not only acknowledged
