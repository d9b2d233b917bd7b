"""Release: work goes out as workers free slots, within each user's max_concurrent, to the worker
that served the conversation last when it can take it; the fleet view reads heartbeats sparingly."""

from __future__ import annotations

import json
import time

import pytest

from apps.admission.models import Plan
from apps.chat.services import conversation_create
from core.redis_client import get_redis
from tests.admission.conftest import (
    give_the_fleet_slots,
    keys,
    publish,
    state,
    work_item_ids,
    worker_answers,
)

pytestmark = pytest.mark.django_db


def test_a_user_runs_no_more_than_the_plan_allows_at_once(make_dispatcher, user, other_user):
    Plan.objects.filter(slug="free").update(max_concurrent=1)
    give_the_fleet_slots(4)
    first, second = publish(user.id), publish(user.id)
    other = publish(other_user.id)
    dispatcher = make_dispatcher()
    dispatcher.step()
    assert set(work_item_ids(keys().work)) == {first, other}
    assert state(second) == "queued"
    worker_answers(first)
    dispatcher.step()  # the recorder's pass settles the first: its slot is the user's again
    dispatcher.step()
    assert state(second) == "dispatched"


def test_no_more_work_goes_out_than_the_workers_have_free_slots(make_dispatcher, user, other_user):
    Plan.objects.filter(slug="free").update(max_concurrent=10)
    give_the_fleet_slots(2)
    ids = [publish(user.id) for _ in range(3)] + [publish(other_user.id) for _ in range(3)]
    dispatcher = make_dispatcher()
    dispatcher.step()
    dispatcher.step()
    assert len(work_item_ids(keys().work)) == 2  # the stream holds only what slots can take
    assert len(dispatcher.line) == 4
    assert sum(state(i) == "dispatched" for i in ids) == 2


def test_a_conversation_goes_back_to_the_worker_that_holds_its_prefix(make_dispatcher, user):
    conversation = conversation_create(owner=user)
    give_the_fleet_slots(2, worker_id="w1")
    give_the_fleet_slots(2, worker_id="w2")
    dispatcher = make_dispatcher()
    first = publish(user.id, conversation=conversation.id)
    dispatcher.step()
    assert work_item_ids(keys().work) == [first]  # nobody holds it yet: the shared stream
    worker_answers(first, worker_id="w2")
    dispatcher.step()  # the recorder's pass: the dispatcher learns who served it
    follow_up = publish(user.id, conversation=conversation.id)
    dispatcher.step()
    assert work_item_ids(keys().work_for("w2")) == [follow_up]


def test_heartbeats_are_reread_at_most_every_fleet_interval_stream_lengths_every_time(
    make_dispatcher,
):
    client = get_redis()

    def beat(slots: int) -> None:
        client.set(keys().heartbeat("w1"), json.dumps({"worker_id": "w1", "slots": slots}), ex=60)
        client.zadd(keys().workers, {"w1": time.time()})

    fleet = make_dispatcher(fleet_interval=1.0).fleet
    assert fleet.refresh().slots == 0
    beat(4)
    assert fleet.refresh().slots == 4  # no worker was known: read at once
    beat(8)
    assert fleet.refresh().slots == 4  # within the interval: the heartbeats kept
    client.xadd(keys().work, {"id": "x"})
    assert fleet.refresh().queued_on_streams == 1  # lengths are always fresh
    time.sleep(1.05)  # real time: the fleet interval passes
    assert fleet.refresh().slots == 8  # the interval has passed


def test_a_garbled_heartbeat_is_ignored(make_dispatcher):
    get_redis().set(keys().heartbeat("bad"), "{not json", ex=60)
    get_redis().zadd(keys().workers, {"bad": time.time()})
    give_the_fleet_slots(3)
    assert make_dispatcher().fleet.refresh().slots == 3


def test_a_new_requests_routing_entries_are_read_with_the_fleet_and_heartbeats_too(
    make_dispatcher, user, packets
):
    """A request that finds a free slot waits on one round trip for its buckets and the fleet
    (the heartbeats, the streams' lengths, its conversation's worker, and the write of what
    the last answer taught), not on five."""
    conversation = conversation_create(owner=user)
    give_the_fleet_slots(2, worker_id="w1")
    give_the_fleet_slots(2, worker_id="w2")
    dispatcher = make_dispatcher(sweep_interval=60)
    first = publish(user.id, conversation=conversation.id)
    dispatcher.step()
    worker_answers(first, worker_id="w2")
    dispatcher.step()  # the recorder's pass: the dispatcher learns who served it
    follow_up = publish(user.id, conversation=conversation.id)
    packets.clear()
    dispatcher.step()
    assert work_item_ids(keys().work_for("w2")) == [follow_up]
    fleet_reads = [names for names in packets if b"XLEN" in names]
    assert len(fleet_reads) == 1, packets
    assert {b"EVAL", b"ZRANGEBYSCORE", b"MGET", b"SET"} <= set(fleet_reads[0])
    assert fleet_reads[0].count(b"MGET") == 2  # the heartbeats and the routing entries
    assert [names for names in packets if names in ([b"MGET"], [b"SET"])] == [], packets
    assert get_redis().get(keys().affinity("conv", str(conversation.id))) == "w2"


def test_a_worker_that_joins_is_read_and_routed_to_in_the_same_pass(make_dispatcher, user):
    """The heartbeats read with the fleet are the known workers'; a new one's is read then."""
    give_the_fleet_slots(1, worker_id="w1")
    dispatcher = make_dispatcher()
    dispatcher.step()
    busy = publish(user.id)
    dispatcher.step()
    assert state(busy) == "dispatched"  # w1's one slot is taken
    give_the_fleet_slots(1, worker_id="w2")
    waiting = publish(user.id)
    dispatcher.step()
    assert state(waiting) == "dispatched"
    assert dispatcher.fleet.fleet.slots == 2
    assert set(dispatcher.fleet.fleet.workers) == {"w1", "w2"}


@pytest.mark.parametrize("arriving", [1, 20])  # the bucket script inline, and on its helper
def test_the_buckets_and_the_fleet_are_read_together_even_when_redis_lost_its_scripts(
    make_dispatcher, user, arriving, packets
):
    """The bucket script rides in a pipeline with the fleet's reads (inline, and from the
    helper thread for a large batch): it still runs when Redis has lost its scripts (a
    restart), the fleet read beside it serves the pass, and nothing reads the fleet again."""
    Plan.objects.filter(slug="free").update(
        max_concurrent=50, burst_requests=50, burst_tokens=100_000
    )
    give_the_fleet_slots(arriving + 1)
    dispatcher = make_dispatcher()
    publish(user.id)
    dispatcher.step()  # the fleet is known from here on
    get_redis().script_flush()
    ids = [publish(user.id) for _ in range(arriving)]
    packets.clear()
    dispatcher.step()
    assert all(state(i) == "dispatched" for i in ids)
    assert dispatcher.fleet.fleet.slots == arriving + 1
    fleet_reads = [names for names in packets if b"XLEN" in names]
    assert len(fleet_reads) == 1 and b"EVAL" in fleet_reads[0], packets
