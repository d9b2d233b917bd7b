"""A long queue, where the dispatcher no longer visits every request on every pass: deadlines,
stops and positions must still reach each request, wherever it waits in the line."""

from __future__ import annotations

import json
import time

import pytest

from apps.admission.models import Plan
from apps.admission.services import plan_assign, request_cancel_signal
from chatsite.redis_client import get_redis
from tests.admission.conftest import events, final, publish
from worker.protocol import Keys

pytestmark = pytest.mark.django_db


def roomy_plan(**limits) -> Plan:
    """The default plan with room for hundreds of requests at once: nothing waits on a rate."""
    values = dict(burst_requests=10_000, requests_per_minute=10_000, burst_tokens=10_000_000,
                  tokens_per_minute=10_000_000, tokens_per_day=100_000_000)  # fmt: skip
    values.update(limits)
    Plan.objects.filter(slug="free").update(**values)
    return Plan.objects.get(slug="free")


def queue_many(users, per_user: int) -> list[str]:
    return [publish(user.id) for _ in range(per_user) for user in users]


def positions_heard(request_id: str) -> list[int]:
    return [int(e["position"]) for e in events(request_id) if e.get("position")]


@pytest.fixture
def third_user(db):
    from apps.accounts.services import user_create

    return user_create(username="carol", password="correct-horse-battery")


def keys() -> Keys:
    from django.conf import settings

    return Keys(prefix=settings.SLUICE_REDIS_PREFIX)


def test_a_deadline_in_the_middle_of_a_long_queue_fires(make_dispatcher, user, other_user, clock):
    roomy_plan(max_queue_wait_seconds=600)
    short = Plan.objects.create(slug="short", name="Short", max_queue_wait_seconds=5)
    plan_assign(user=other_user, plan=short)
    before = queue_many([user], 150)
    impatient = publish(other_user.id)
    after = queue_many([user], 150)
    dispatcher = make_dispatcher()
    dispatcher.step()
    assert final(impatient) is None
    clock.now += 6
    dispatcher.step()
    end = final(impatient)
    assert end["state"] == "failed" and "without a free worker" in end["error"]
    assert impatient not in dispatcher.records
    assert not get_redis().hexists(dispatcher.akeys.queue, impatient)
    assert set(dispatcher.records) == set(before + after)  # the others still wait


def test_a_stop_deep_in_a_long_queue_ends_the_request_at_the_next_sweep(
    make_dispatcher, user, other_user
):
    roomy_plan()
    ids = queue_many([user, other_user], 150)
    # Far fewer flags read per sweep than requests wait: the note is what finds this stop.
    dispatcher = make_dispatcher(cancel_checks=5)
    dispatcher.step()
    deep = ids[250]
    request_cancel_signal(request_id=deep)
    dispatcher.step()
    assert final(deep)["state"] == "cancelled"
    assert deep not in dispatcher.records
    assert not get_redis().hexists(dispatcher.akeys.queue, deep)
    assert len(dispatcher.records) == 299
    assert get_redis().scard(dispatcher.akeys.cancels) == 0
    assert get_redis().exists(keys().cancel(deep))  # a worker would see the stop as well


def test_a_cancel_flag_alone_is_found_within_one_round_of_the_queue(
    make_dispatcher, user, other_user
):
    roomy_plan()
    ids = queue_many([user, other_user], 150)
    dispatcher = make_dispatcher(cancel_checks=50)
    dispatcher.step()
    deep = ids[280]
    # As a web process that only sets the flag would: the sweep reads 50 flags per pass.
    get_redis().set(keys().cancel(deep), "1", ex=60)
    sweeps = 0
    while final(deep) is None and sweeps < 300 // 50 + 1:
        dispatcher.step()
        sweeps += 1
    assert final(deep)["state"] == "cancelled"
    assert deep not in dispatcher.records and len(dispatcher.records) == 299


def give_the_fleet_slots(slots: int) -> None:
    """A live worker with free slots, as its heartbeat tells the dispatcher."""
    beat = {"worker_id": "w-test", "slots": slots, "busy": 0, "healthy": True}
    client = get_redis()
    client.set(keys().heartbeat("w-test"), json.dumps(beat), ex=60)
    client.zadd(keys().workers, {"w-test": time.time()})


def test_positions_after_releases_follow_the_release_order(
    make_dispatcher, user, other_user, third_user, clock
):
    roomy_plan(max_concurrent=2)
    ids = queue_many([user, other_user, third_user], 10)
    dispatcher = make_dispatcher()
    dispatcher.step()
    assert sorted(positions_heard(i)[-1] for i in ids) == list(range(1, 31))
    give_the_fleet_slots(4)
    dispatcher.step()  # four leave for the worker
    released = [i for i in ids if i not in dispatcher.records]
    assert len(released) == 4
    assert all(any(e.get("state") == "dispatched" for e in events(i)) for i in released)
    clock.now += 6  # deep requests hear again after a few seconds
    dispatcher.step()
    line = [entry.id for entry in dispatcher.fq.order()]
    assert [positions_heard(i)[-1] for i in line] == list(range(1, 27))


def test_every_waiting_request_hears_its_position_within_the_push_bound(
    make_dispatcher, user, other_user, third_user
):
    roomy_plan()
    ids = queue_many([user, other_user, third_user], 40)
    dispatcher = make_dispatcher(position_pushes=25)
    pushes = []
    for _ in range(120 // 25 + 1):
        dispatcher.step()
        pushes.append(sum(len(positions_heard(i)) for i in ids) - sum(pushes))
    assert max(pushes) <= 25
    assert all(positions_heard(i) for i in ids)
    line = [entry.id for entry in dispatcher.fq.order()]
    assert [positions_heard(i)[-1] for i in line] == list(range(1, 121))


def test_a_request_stopped_in_the_queue_gets_its_tokens_back(make_dispatcher, user):
    # 400 tokens at once, refilled at one a second: a second 300-token request would wait
    # minutes unless the first one's charge comes back.
    Plan.objects.filter(slug="free").update(burst_tokens=400, tokens_per_minute=60)
    first = publish(user.id, prompt_tokens=100, max_tokens=200)
    dispatcher = make_dispatcher()
    dispatcher.step()
    assert dispatcher.records[first]["charged"]
    request_cancel_signal(request_id=first)
    dispatcher.step()  # cancelled: its charge goes to the recorder with the end
    assert final(first)["state"] == "cancelled"
    dispatcher.step()  # the recorder's pass reconciles it: all 300 tokens come back
    second = publish(user.id, prompt_tokens=100, max_tokens=200)
    dispatcher.step()
    assert dispatcher.records[second]["charged"]
