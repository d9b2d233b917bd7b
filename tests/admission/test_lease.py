"""Active/standby: one dispatcher acts; the other takes over the same line when the first stops
renewing its lease, and a holder that lost its lease stops acting."""

from __future__ import annotations

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
