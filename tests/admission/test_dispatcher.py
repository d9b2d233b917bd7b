"""Admission decisions as users see them: rejections that explain themselves, positions that
move, requests that never wait forever, degradation effects, a standby that takes over."""

from __future__ import annotations

import time

import pytest

from apps.admission.models import Plan
from apps.admission.selectors import degradation_level, retrieval_degraded
from apps.admission.services import plan_assign
from chatsite.redis_client import get_redis
from tests.admission.conftest import events, final, force_level, publish
from worker.protocol import Keys

pytestmark = pytest.mark.django_db


def free_plan(**limits) -> Plan:
    Plan.objects.filter(slug="free").update(**limits)
    return Plan.objects.get(slug="free")


def test_a_request_larger_than_the_plan_is_rejected_at_once(make_dispatcher, user):
    free_plan(burst_tokens=500)
    request_id = publish(user.id, max_tokens=1000)
    make_dispatcher().step()
    end = final(request_id)
    assert end["state"] == "failed"
    assert "more than your plan allows" in end["error"]
    assert get_redis().hget(Keys(prefix=user_prefix()).request(request_id), "state") == "failed"


def user_prefix() -> str:
    from django.conf import settings

    return settings.SLUICE_REDIS_PREFIX


def test_waiting_requests_hear_their_position_and_eta(make_dispatcher, user, other_user):
    ids = [publish(user.id), publish(other_user.id), publish(user.id)]
    dispatcher = make_dispatcher()
    dispatcher.step()  # no worker is running: everything waits
    positions = {}
    for request_id in ids:
        queued = [e for e in events(request_id) if e.get("position")]
        positions[request_id] = int(queued[-1]["position"])
        assert int(queued[-1]["eta_seconds"]) >= 1
    assert sorted(positions.values()) == [1, 2, 3]
    # Fair order: the other user's single request is not behind both of alice's.
    assert positions[ids[1]] <= 2


def test_a_request_that_waits_past_its_plan_limit_fails_clearly(make_dispatcher, user, clock):
    free_plan(max_queue_wait_seconds=5)
    request_id = publish(user.id)
    dispatcher = make_dispatcher()
    dispatcher.step()
    assert final(request_id) is None
    clock.now += 6
    dispatcher.step()
    end = final(request_id)
    assert end["state"] == "failed" and "without a free worker" in end["error"]
    assert end["retry_after"] == "60"
    assert request_id not in dispatcher.records
    assert not get_redis().hexists(dispatcher.akeys.queue, request_id)


def test_stop_while_queued_cancels(make_dispatcher, user):
    request_id = publish(user.id)
    dispatcher = make_dispatcher()
    dispatcher.step()
    get_redis().set(Keys(prefix=user_prefix()).cancel(request_id), "1", ex=60)
    dispatcher.step()
    assert final(request_id)["state"] == "cancelled"
    assert request_id not in dispatcher.records


def test_a_user_over_the_request_rate_waits_then_runs(make_dispatcher, user, clock):
    free_plan(burst_requests=1, requests_per_minute=60)
    first, second = publish(user.id), publish(user.id)
    dispatcher = make_dispatcher()
    dispatcher.step()
    assert dispatcher.records[first]["charged"]
    assert not dispatcher.records[second]["charged"]
    held = [e for e in events(second) if e.get("reason")]
    assert "limit on requests" in held[-1]["reason"]
    clock.now += 1.01
    dispatcher.step()
    assert dispatcher.records[second]["charged"]


def test_a_spent_daily_quota_is_rejected_with_when_to_retry(make_dispatcher, user):
    free_plan(tokens_per_day=2000, burst_tokens=2000)
    first, second = publish(user.id, max_tokens=1000), publish(user.id, max_tokens=1000)
    make_dispatcher().step()
    assert final(first) is None
    end = final(second)
    assert end["state"] == "failed" and "today's tokens" in end["error"]
    assert int(end["retry_after"]) > 60


def test_degradation_caps_answers_then_sheds_the_lowest_plan(make_dispatcher, user, other_user):
    force_level(1)
    dispatcher = make_dispatcher()
    dispatcher.plans.refresh(force=True)
    dispatcher.publish_degradation()
    capped = publish(user.id, max_tokens=1000)
    dispatcher.step()
    assert dispatcher.records[capped]["fields"]["max_tokens"] == "256"
    assert degradation_level() == 1 and not retrieval_degraded()

    force_level(3)
    pro = Plan.objects.create(slug="pro", name="Pro", priority_weight=4)
    plan_assign(user=other_user, plan=pro)
    dispatcher.plans.refresh(force=True)
    dispatcher.publish_degradation()
    shed, kept = publish(user.id), publish(other_user.id)
    dispatcher.step()
    end = final(shed)
    assert end["state"] == "failed" and "heavy load" in end["error"] and end["retry_after"]
    assert kept in dispatcher.records
    assert degradation_level() == 3 and retrieval_degraded()


def test_the_standby_takes_over_the_queue(make_dispatcher, user, other_user):
    active = make_dispatcher(lease_ms=300)
    standby = make_dispatcher(lease_ms=300)
    ids = {publish(user.id), publish(other_user.id), publish(user.id)}
    active.step()
    standby.step()
    assert active.active and not standby.active
    assert set(active.records) == ids
    time.sleep(0.4)  # the active one stops renewing: as if killed
    standby.step()
    assert standby.active
    assert set(standby.records) == ids
    assert [e.id for e in standby.fq.order()] == [e.id for e in active.fq.order()]


def test_no_admission_key_is_left_without_a_ttl(make_dispatcher, user, clock):
    free_plan(max_queue_wait_seconds=5)
    for _ in range(3):
        publish(user.id)
    dispatcher = make_dispatcher()
    dispatcher.step()
    clock.now += 6
    dispatcher.step()
    client = get_redis()
    prefix = user_prefix()
    keys = list(client.scan_iter(match=f"{prefix}:{{adm}}:*"))
    keys += list(client.scan_iter(match=f"{prefix}:req:*"))
    keys += list(client.scan_iter(match=f"{prefix}:out:*"))
    assert any("bucket" in k for k in keys)
    assert [k for k in keys if client.pttl(k) < 0] == []


def test_heartbeats_are_reread_at_most_every_fleet_interval_stream_lengths_every_time(
    make_dispatcher, redis_prefix
):
    import json

    client = get_redis()
    keys = Keys(prefix=redis_prefix)

    def beat(slots: int) -> None:
        client.set(keys.heartbeat("w1"), json.dumps({"worker_id": "w1", "slots": slots}), ex=60)
        client.zadd(keys.workers, {"w1": time.time()})

    dispatcher = make_dispatcher(fleet_interval=1.0)
    assert dispatcher.refresh_fleet().slots == 0
    beat(4)
    assert dispatcher.refresh_fleet().slots == 4  # no worker was known: read at once
    beat(8)
    assert dispatcher.refresh_fleet().slots == 4  # within the interval: the heartbeats kept
    client.xadd(keys.work, {"id": "x"})
    assert dispatcher.refresh_fleet().queued_on_streams == 1  # lengths are always fresh
    time.sleep(1.05)
    assert dispatcher.refresh_fleet().slots == 8  # the interval has passed
