"""Active/standby: one dispatcher acts; the other takes over the same line when the first stops
renewing its lease, and a holder that lost its lease stops acting."""

from __future__ import annotations

import json
import time

import pytest

from core.redis_client import get_redis
from tests.admission.conftest import keys, publish

pytestmark = pytest.mark.django_db


def test_the_standby_takes_over_the_queue(make_dispatcher, user, other_user):
    active = make_dispatcher(lease_ms=300)
    standby = make_dispatcher(lease_ms=300)
    ids = {publish(user.id), publish(other_user.id), publish(user.id)}
    active.step()
    standby.step()
    assert active.active and not standby.active
    assert set(active.line.requests) == ids
    time.sleep(0.4)  # the active one stops renewing: as if killed
    standby.step()
    assert standby.active
    assert set(standby.line.requests) == ids
    assert standby.line.order() == active.line.order()


def test_a_holder_that_lost_its_lease_stands_by(make_dispatcher, user):
    dispatcher = make_dispatcher(lease_ms=300)
    dispatcher.step()
    assert dispatcher.active
    get_redis().set(keys().lease, "someone-else", px=10_000)  # it was paused past its lease
    time.sleep(0.1)  # past the time it renews
    request_id = publish(user.id)
    assert dispatcher.step() == 0
    assert not dispatcher.active
    assert request_id not in dispatcher.line


def test_a_clean_stop_hands_the_lease_over_at_once(make_dispatcher):
    first, second = make_dispatcher(lease_ms=60_000), make_dispatcher(lease_ms=60_000)
    first.step()
    first.release_lease()
    second.step()
    assert second.active


def test_a_dispatcher_that_takes_over_shows_the_same_heaviest_users(
    make_dispatcher, user, other_user
):
    from tests.admission.conftest import give_the_fleet_slots, roomy_plan, worker_answers

    roomy_plan(max_concurrent=10)
    give_the_fleet_slots(8)
    active = make_dispatcher(lease_ms=300)
    heavy = [publish(user.id) for _ in range(3)]
    light = publish(other_user.id)
    active.step()
    for request_id in heavy:
        worker_answers(request_id, prompt_tokens=100, completion_tokens=300)
    worker_answers(light, prompt_tokens=10, completion_tokens=20)
    active.step()  # the answers settle
    table = active.samples.heaviest()
    assert [(row["user"], row["tokens"], row["requests"]) for row in table] == [
        (str(user.id), 1200, 3),
        (str(other_user.id), 30, 1),
    ]
    time.sleep(0.4)  # the active one stops renewing: as if killed, nothing handed over
    standby = make_dispatcher(lease_ms=300)
    standby.step()
    assert standby.active
    published = json.loads(get_redis().get(keys().ops_state))
    assert published["holder"] == standby.lease.holder
    assert published["users"] == table
