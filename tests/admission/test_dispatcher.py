"""The dispatcher's loop as a whole: a request's way from the web to a worker, keys that never
outlive their use, and a Redis that comes back empty-handed. (Each phase has its own tests.)"""

from __future__ import annotations

import pytest

from apps.admission.models import Plan
from contract import protocol
from core.redis_client import get_redis
from tests.admission.conftest import (
    events,
    give_the_fleet_slots,
    keys,
    publish,
    state,
    work_item_ids,
)

pytestmark = pytest.mark.django_db


def test_a_request_waits_for_a_worker_then_goes_to_it(make_dispatcher, user):
    request_id = publish(user.id)
    dispatcher = make_dispatcher()
    dispatcher.step()
    assert state(request_id) == "queued"
    assert [e["position"] for e in events(request_id) if e.get("position")] == ["1"]
    give_the_fleet_slots(1)
    dispatcher.step()
    assert state(request_id) == "dispatched"
    assert work_item_ids(keys().work) == [request_id]
    assert not get_redis().hexists(keys().queue, request_id)
    assert get_redis().hexists(keys().running, request_id)


def test_no_admission_key_is_left_without_a_ttl(make_dispatcher, user, clock):
    Plan.objects.filter(slug="free").update(max_queue_wait_seconds=5)
    give_the_fleet_slots(1)
    for _ in range(4):
        publish(user.id)
    dispatcher = make_dispatcher()
    dispatcher.step()  # one runs, three wait...
    clock.now += 6
    dispatcher.step()  # ...and time out
    client = get_redis()
    prefix = keys().prefix
    names = list(client.scan_iter(match=f"{prefix}:{{adm}}:*"))
    names += list(client.scan_iter(match=f"{prefix}:req:*"))
    names += list(client.scan_iter(match=f"{prefix}:out:*"))
    assert any("bucket" in k for k in names) and any("running" in k for k in names)
    streams = {keys().admit, keys().done}  # trimmed by length, not by time
    assert [k for k in names if client.pttl(k) < 0 and k not in streams] == []


def test_a_redis_that_lost_its_groups_costs_one_pass(make_dispatcher, user, other_user):
    # As after a Redis restarted without its data: the groups are gone. The pass that finds
    # out fails; the next recreates them and rebuilds the line from what Redis still holds.
    waiting = publish(user.id)
    dispatcher = make_dispatcher()
    dispatcher.step()
    loads = dispatcher.loads
    get_redis().xgroup_destroy(keys().admit, protocol.DISPATCHER_GROUP)
    arriving = publish(other_user.id)
    with pytest.raises(Exception, match="NOGROUP"):
        dispatcher.step()
    dispatcher.step()
    assert dispatcher.loads == loads + 1
    assert set(dispatcher.line.requests) == {waiting, arriving}


def multis(packets: list[list[bytes]]) -> list[list[bytes]]:
    """The MULTI blocks among what was sent: each one's commands, MULTI and EXEC left out."""
    return [
        [n for n in names if n not in (b"MULTI", b"EXEC")]
        for names in packets
        if names and names[0] == b"MULTI"
    ]


def test_a_request_that_finds_a_free_slot_is_decided_and_released_in_one_multi(
    make_dispatcher, user, packets
):
    give_the_fleet_slots(1)
    dispatcher = make_dispatcher(sweep_interval=60)  # a sweep due writes the new ones first
    dispatcher.step()
    request_id = publish(user.id)
    packets.clear()
    dispatcher.step()
    assert state(request_id) == "dispatched"
    assert work_item_ids(keys().work) == [request_id]
    decisions = [names for names in multis(packets) if b"XACK" in names]
    assert len(decisions) == 1 and b"XADD" in decisions[0], packets  # acknowledged and sent
    assert not get_redis().hexists(keys().queue, request_id)
    assert get_redis().xpending(keys().admit, protocol.DISPATCHER_GROUP)["pending"] == 0


def test_new_requests_are_written_before_a_held_ones_retry(
    make_dispatcher, user, other_user, clock, packets
):
    """The held request's retry writes the line too: in a pass with both, the new requests'
    MULTI goes first, on its own."""
    Plan.objects.filter(slug="free").update(
        burst_requests=1, requests_per_minute=6, max_queue_wait_seconds=60
    )
    dispatcher = make_dispatcher(sweep_interval=60)
    publish(user.id)
    held = publish(user.id)
    dispatcher.step()
    assert dispatcher.line.requests[held].held_by == "req"
    clock.now += 11  # the held one's wait is over
    arriving = publish(other_user.id)
    packets.clear()
    dispatcher.step()
    transactions = multis(packets)
    decided = next(i for i, names in enumerate(transactions) if b"XACK" in names)
    retried = next(
        i for i, names in enumerate(transactions) if b"XACK" not in names and b"HSET" in names
    )
    assert decided < retried, transactions
    assert not dispatcher.line.requests[held].held_by
    assert state(arriving) == "queued"
    assert get_redis().hexists(keys().queue, arriving) and get_redis().hexists(keys().queue, held)
