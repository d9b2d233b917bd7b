"""Routing: KV-cache affinity kept in Redis survives a dispatcher failover; a busy cached worker
loses the request to the shared stream; a shared system prompt (with its passages) routes a new
conversation to the worker that read it; push policies push; a worker whose breaker is open is
out of routing."""

from __future__ import annotations

import json
import time

import pytest

from apps.chat.submission import request_publish
from contract.protocol import WorkItem, new_request_id
from core.redis_client import get_redis
from tests.admission.conftest import (
    give_the_fleet_slots,
    keys,
    publish,
    roomy_plan,
    state,
    work_item_ids,
    worker_answers,
)

pytestmark = pytest.mark.django_db

PASSAGES = "You are helpful. Sources: " + "the river Sluice flows north. " * 40


def ask(user_id, conversation, *, system: str = "", history: int = 2) -> str:
    """A request whose prompt is a system message (if any), `history` earlier turns and a new
    question, as the web builds it."""
    messages = [{"role": "system", "content": system}] if system else []
    for n in range(history):
        messages.append(
            {"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n} " * 20}
        )
    messages.append({"role": "user", "content": "And then?"})
    item = WorkItem(
        id=new_request_id(),
        user_id=str(user_id),
        conversation_id=str(conversation),
        messages=messages,
        max_tokens=32,
        prompt_tokens_estimate=200,
    )
    request_publish(item=item)
    return item.id


def served(dispatcher, request_id: str, worker_id: str) -> None:
    """A worker answers it and the dispatcher's recorder pass learns who did."""
    worker_answers(request_id, worker_id=worker_id)
    dispatcher.step()


def test_affinity_survives_a_dispatcher_failover(make_dispatcher, user):
    roomy_plan()
    give_the_fleet_slots(2, worker_id="w1")
    give_the_fleet_slots(2, worker_id="w2")
    first = make_dispatcher()
    request = ask(user.id, 41)
    first.step()
    assert work_item_ids(keys().work) == [request]  # nobody holds it yet: the shared stream
    served(first, request, "w2")
    first.step()  # writes what it learnt
    first.release_lease()
    del first  # its memory is gone with it: only Redis remembers

    stored = keys().affinity("conv", "41")
    assert get_redis().get(stored) == "w2"
    assert 0 < get_redis().ttl(stored) <= 1800

    standby = make_dispatcher()
    follow_up = ask(user.id, 41, history=4)
    standby.step()
    assert work_item_ids(keys().work_for("w2")) == [follow_up]
    assert standby.fleet.router.counts.affinity == 1


def test_a_busy_cached_worker_loses_the_request_to_the_shared_stream(
    make_dispatcher, user, settings
):
    settings.SLUICE_AFFINITY_MAX_LOAD = 1.0  # no work waits for a worker with no free slot
    roomy_plan()
    give_the_fleet_slots(2, worker_id="w1")
    give_the_fleet_slots(2, worker_id="w2")
    dispatcher = make_dispatcher()
    request = ask(user.id, 42)
    dispatcher.step()
    served(dispatcher, request, "w2")
    give_the_fleet_slots(2, worker_id="w2", running=("a", "b"))  # both its slots busy now
    follow_up = ask(user.id, 42, history=4)
    dispatcher.step()
    assert work_item_ids(keys().work) == [follow_up]
    assert work_item_ids(keys().work_for("w2")) == []
    assert dispatcher.fleet.router.counts.fallbacks == 1


def test_a_new_conversation_goes_to_the_worker_that_read_its_system_prompt(
    make_dispatcher, user, other_user
):
    roomy_plan()
    for worker_id in ("w1", "w2", "w3"):
        give_the_fleet_slots(4, worker_id=worker_id)
    dispatcher = make_dispatcher()
    request = ask(user.id, 43, system=PASSAGES)
    dispatcher.step()
    served(dispatcher, request, "w3")
    same_passages = ask(other_user.id, 44, system=PASSAGES, history=0)
    other_passages = ask(other_user.id, 45, system="You are terse.", history=0)
    dispatcher.step()
    assert work_item_ids(keys().work_for("w3")) == [same_passages]
    assert work_item_ids(keys().work) == [other_passages]
    assert dispatcher.fleet.router.counts.prefix == 1


def test_round_robin_pushes_every_request_at_once_and_pull_pushes_none(
    make_dispatcher, user, settings
):
    roomy_plan(max_concurrent=100)
    give_the_fleet_slots(1, worker_id="w1")
    give_the_fleet_slots(1, worker_id="w2")
    settings.SLUICE_ROUTING = "round-robin"
    pushing = make_dispatcher()
    ids = [publish(user.id, conversation=50 + n) for n in range(6)]
    pushing.step()
    # A load balancer forwards all six at once, in turn, past the two free slots.
    assert len(work_item_ids(keys().work_for("w1"))) == 3
    assert len(work_item_ids(keys().work_for("w2"))) == 3
    assert all(state(i) == "dispatched" for i in ids)
    pushing.release_lease()

    settings.SLUICE_ROUTING = "pull"
    pulling = make_dispatcher()
    more = [publish(user.id, conversation=60 + n) for n in range(3)]
    pulling.step()
    assert work_item_ids(keys().work) == []  # the workers' streams already hold six
    assert all(state(i) == "queued" for i in more)


def test_an_unknown_routing_policy_is_refused(make_dispatcher, settings):
    settings.SLUICE_ROUTING = "random"
    with pytest.raises(ValueError, match="SLUICE_ROUTING"):
        make_dispatcher()


def beat_with_breaker(worker_id: str, state_name: str, slots: int = 4) -> None:
    beat = {
        "worker_id": worker_id,
        "slots": slots,
        "busy": 0,
        "healthy": True,
        "breaker": {"state": state_name, "error_rate": 0.5},
    }
    get_redis().set(keys().heartbeat(worker_id), json.dumps(beat), ex=60)
    get_redis().zadd(keys().workers, {worker_id: time.time()})


def test_a_worker_whose_breaker_is_open_gets_no_work_and_half_open_one_probe(make_dispatcher, user):
    roomy_plan(max_concurrent=100)
    beat_with_breaker("broken", "open")
    dispatcher = make_dispatcher()
    ids = [publish(user.id, conversation=70 + n) for n in range(3)]
    dispatcher.step()
    assert all(state(i) == "queued" for i in ids)  # its four slots do not count
    assert dispatcher.fleet.fleet.breakers_open == ["broken"]

    beat_with_breaker("broken", "half_open")
    dispatcher.step()
    assert sum(state(i) == "dispatched" for i in ids) == 1  # room for the probe only
    assert work_item_ids(keys().work_for("broken")) == []  # pulled from the shared stream


def test_work_queued_for_a_full_workers_cache_holds_back_no_other_workers_slot(
    make_dispatcher, user
):
    roomy_plan(max_concurrent=100)
    give_the_fleet_slots(1, worker_id="w1", running=("x",))
    give_the_fleet_slots(1, worker_id="w2")
    for n in range(2):  # routed to w1 for its cache; it will read them as it frees its slot
        get_redis().xadd(keys().work_for("w1"), {"id": f"waiting-{n}"})
    request = publish(user.id, conversation=80)
    make_dispatcher().step()
    assert work_item_ids(keys().work) == [request]  # w2's free slot takes it
