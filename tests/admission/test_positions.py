"""Positions: every waiting request hears its place in line and an ETA, the head at every
change, the rest within a bound on pushes, in the order the line will really move."""

from __future__ import annotations

import pytest

from apps.admission.line import QueuedRequest
from apps.admission.models import Plan
from apps.admission.positions import HEAD, positions_to_tell
from tests.admission.conftest import events, give_the_fleet_slots, publish, queue_many, roomy_plan


def positions_heard(request_id: str) -> list[int]:
    return [int(e["position"]) for e in events(request_id) if e.get("position")]


@pytest.fixture
def third_user(db):
    from apps.accounts.services import user_create

    return user_create(username="carol", password="correct-horse-battery")


@pytest.mark.django_db
def test_waiting_requests_hear_their_position_and_eta(make_dispatcher, user, other_user):
    ids = [publish(user.id), publish(other_user.id), publish(user.id)]
    make_dispatcher().step()  # no worker is running: everything waits
    positions = {}
    for request_id in ids:
        queued = [e for e in events(request_id) if e.get("position")]
        positions[request_id] = int(queued[-1]["position"])
        assert int(queued[-1]["eta_seconds"]) >= 1
    assert sorted(positions.values()) == [1, 2, 3]
    # Fair order: the other user's single request is not behind both of alice's.
    assert positions[ids[1]] <= 2


@pytest.mark.django_db
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
    released = [i for i in ids if i not in dispatcher.line]
    assert len(released) == 4
    assert all(any(e.get("state") == "dispatched" for e in events(i)) for i in released)
    clock.now += 6  # deep requests hear again after a few seconds
    dispatcher.step()
    line = [entry.id for entry in dispatcher.line.fair.order()]
    assert [positions_heard(i)[-1] for i in line] == list(range(1, 27))


@pytest.mark.django_db
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
    line = [entry.id for entry in dispatcher.line.fair.order()]
    assert [positions_heard(i)[-1] for i in line] == list(range(1, 121))


@pytest.mark.django_db
def test_a_request_held_by_its_plans_rate_hears_why_and_until_when(make_dispatcher, user):
    Plan.objects.filter(slug="free").update(burst_requests=1, requests_per_minute=6)
    publish(user.id)
    held = publish(user.id)
    make_dispatcher().step()
    told = [e for e in events(held) if e.get("position")][-1]
    assert "limit on requests holds this request for about 10 s" in told["reason"]
    assert int(told["eta_seconds"]) >= 10


def waiting(request_id: str, *, told: int = 0, told_at: int = 0) -> QueuedRequest:
    return QueuedRequest(
        request_id,
        "1",
        "1",
        "chat",
        "free",
        10,
        10,
        1.0,
        0,
        10**12,
        0,
        True,
        0,
        "",
        {},
        told_position=told,
        told_at_ms=told_at,
    )


def test_the_head_hears_every_change_and_the_rest_within_the_limit():
    order = [f"r{i}" for i in range(100)]
    line = {rid: waiting(rid, told=i + 2) for i, rid in enumerate(order)}  # all moved up
    line["r99"] = waiting("r99")  # never told
    chosen = positions_to_tell(order, line, now_ms=1000, limit=HEAD + 1)
    assert [rid for _, rid in chosen] == [*order[:HEAD], "r99"]
    # Later, with the news of the rest old enough: the stalest hear first.
    line["r99"] = waiting("r99", told=100, told_at=1000)
    line["r50"].told_at_ms = -10_000
    chosen = positions_to_tell(order, line, now_ms=10_000, limit=HEAD + 2)
    assert chosen[HEAD:] == [(51, "r50"), (21, "r20")]
