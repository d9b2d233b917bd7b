"""A request's state changes: attempts fenced, one ending, and what each writer may overwrite."""

from __future__ import annotations

import pytest
import redis

from contract import protocol, transitions
from contract.protocol import Answer, Keys, State, WorkItem
from core.redis_client import get_redis


@pytest.fixture
def keys(redis_prefix) -> Keys:
    return Keys(prefix=redis_prefix)


def run(queue) -> list:
    pipe = get_redis().pipeline(transaction=False)
    queue(pipe)
    return pipe.execute()


def submit(keys: Keys, request_id: str = "r1") -> WorkItem:
    item = WorkItem(
        id=request_id,
        user_id="7",
        conversation_id="3",
        messages=[{"role": "user", "content": "Hi"}],
    )
    run(
        lambda p: transitions.submitted(
            p, keys, item, citations=[], stream=keys.admit, submit_by_ms=protocol.now_ms() + 5000
        )
    )
    return item


def start(keys: Keys, token: str, *, request_id: str = "r1", most: int = 0):
    reply = run(
        lambda p: transitions.start(
            p, keys, request_id, token=token, worker_id=token, max_attempts=most
        )
    )[0]
    return transitions.start_result(reply)


def delta(keys: Keys, token: str, text: str, batch: int) -> int:
    return run(lambda p: transitions.delta(p, keys, "r1", token=token, text=text, batch=batch))[0]


def finish(
    keys: Keys, token: str, state: State = State.DONE, text: str = "", attempt: int = 0
) -> int:
    answer = Answer(
        id="r1", user_id="7", conversation_id="3", state=state, text=text, attempt=attempt
    )
    return transitions.finish_result(
        run(lambda p: transitions.finish(p, keys, answer, token=token))[0]
    )


def events(keys: Keys, request_id: str = "r1") -> list[dict]:
    return [fields for _, fields in get_redis().xrange(keys.output(request_id))]


def test_a_replaced_attempt_can_no_longer_write(keys):
    submit(keys)
    first = start(keys, "a")
    assert (first.code, first.attempt) == (transitions.STARTED, 1)
    assert delta(keys, "a", "tok0 ", 1) == 1
    second = start(keys, "b")  # a, paused, was taken for dead
    assert second.attempt == 2
    assert delta(keys, "a", "tok1 ", 2) == 0
    assert finish(keys, "a", text="tok0 tok1 ") == transitions.LOST
    assert delta(keys, "b", "tok0 ", 1) == 1
    assert finish(keys, "b", text="tok0 ", attempt=2) == transitions.ENDED_NOW
    kinds = [(e["type"], e.get("attempt"), e.get("text")) for e in events(keys)]
    assert kinds == [
        ("status", None, None),
        ("start", "1", None),
        ("delta", None, "tok0 "),
        ("start", "2", None),
        ("delta", None, "tok0 "),
        ("final", "2", "tok0 "),
    ]


def test_a_request_ends_once(keys):
    submit(keys)
    start(keys, "a")
    assert finish(keys, "", State.FAILED) == transitions.ENDED_NOW  # the dispatcher gives up
    assert finish(keys, "a", text="late") == transitions.ALREADY_ENDED
    assert delta(keys, "a", "late", 1) == 0  # ending clears the owner: the attempt stops
    assert [e["type"] for e in events(keys)].count("final") == 1
    assert get_redis().hget(keys.request("r1"), "state") == "failed"


def test_an_attempt_resending_its_own_finish_is_told_it_ended_it(keys):
    submit(keys)
    start(keys, "a")
    assert finish(keys, "a", text="x") == transitions.ENDED_NOW
    # The reply was lost (Redis restarted): sent again, it still says "yours", so the attempt
    # writes its answer record, and no second final event appears.
    assert finish(keys, "a", text="x") == transitions.ENDED_NOW
    assert [e["type"] for e in events(keys)].count("final") == 1


def test_a_batch_sent_twice_is_written_once(keys):
    submit(keys)
    start(keys, "a")
    assert delta(keys, "a", "one ", 1) == 1
    assert delta(keys, "a", "one ", 1) == 1  # resent after a lost reply
    assert delta(keys, "a", "two ", 2) == 1
    assert [e["text"] for e in events(keys) if e["type"] == "delta"] == ["one ", "two "]


def test_an_ended_request_is_not_started_again(keys):
    submit(keys)
    start(keys, "a")
    finish(keys, "a")
    assert start(keys, "b").code == transitions.START_ENDED


def test_a_stopped_request_is_claimed_without_starting(keys):
    submit(keys)
    run(lambda p: transitions.stopped(p, keys, "r1"))
    started = start(keys, "a")
    assert started.code == transitions.START_STOPPED
    assert "start" not in [e["type"] for e in events(keys)]
    assert finish(keys, "a", State.CANCELLED) == transitions.ENDED_NOW


def test_a_request_started_too_often_is_not_run(keys):
    submit(keys)
    for token in ("a", "b", "c"):
        assert start(keys, token, most=3).code == transitions.STARTED
    exhausted = start(keys, "d", most=3)
    assert (exhausted.code, exhausted.attempt) == (transitions.START_EXHAUSTED, 4)


def test_dispatched_never_overwrites_a_later_state(keys):
    submit(keys)
    start(keys, "a")  # the worker was quicker than the dispatcher's own bookkeeping
    run(lambda p: transitions.dispatched(p, keys, "r1", stream=keys.work, fields={"id": "r1"}))
    assert get_redis().hget(keys.request("r1"), "state") == "streaming"
    assert get_redis().xlen(keys.work) == 1


def test_missing_groups_are_created_and_existing_ones_kept(keys):
    client = get_redis()
    for _ in range(2):
        pipe = client.pipeline(transaction=False)
        transitions.ensure_groups(pipe, [(keys.work, protocol.WORKER_GROUP)])
        transitions.check_groups(pipe.execute(raise_on_error=False))
    assert [g["name"] for g in client.xinfo_groups(keys.work)] == [protocol.WORKER_GROUP]
    with pytest.raises(redis.ResponseError) as missing:
        client.xreadgroup("nobody", "c", {keys.admit: ">"}, count=1)
    assert transitions.is_missing_group(missing.value)
