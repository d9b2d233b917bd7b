"""The operations page: what a refresh reads (and what it costs), staff only, and the
dead-letter stream's retry and discard."""

from __future__ import annotations

import json
import time

import pytest

from apps.admission.models import Plan
from apps.ops import dashboard
from contract import transitions
from core.redis_client import get_redis
from tests.admission.conftest import give_the_fleet_slots, keys, roomy_plan
from tests.ops.helpers import CountingRedis, submit, until

pytestmark = pytest.mark.django_db

# One refresh: Redis round trips and SQL queries, whatever the number of workers, waiting
# requests, samples or dead letters.
REDIS_ROUND_TRIPS = 2
SQL_QUERIES = 2


@pytest.fixture
def staff(user):
    user.is_staff = True
    user.save()
    return user


def busy_service(make_dispatcher, users) -> None:
    """Workers (one gone), requests waiting and ended, samples, users and dead letters."""
    roomy_plan()
    give_the_fleet_slots(0, worker_id="w-live")
    give_the_fleet_slots(0, worker_id="w-gone")
    get_redis().delete(keys().heartbeat("w-gone"))
    get_redis().zadd(keys().workers, {"w-gone": time.time() - 60})
    Plan.objects.filter(slug="free").update(burst_tokens=500)
    dispatcher = make_dispatcher()
    for user in users:
        submit(user)
        submit(user, max_tokens=1000, prompt_tokens=600)  # rejected: too large
    dispatcher.step()
    dispatcher.step()
    pipe = get_redis().pipeline()
    transitions.dead_letter(
        pipe,
        keys(),
        source="dispatcher",
        reason="unreadable",
        stream=keys().admit,
        entry_id="1-1",
        fields={"id": "f" * 32, "v": "1", "submit_by_ms": "1"},
    )
    transitions.dead_letter(
        pipe,
        keys(),
        source="recorder",
        reason="malformed",
        stream=keys().done,
        entry_id="1-2",
        fields={"id": "e" * 32},
    )
    pipe.execute()
    until(lambda: get_redis().xlen(keys().series), step=dispatcher.step, timeout=10)


def test_one_refresh_costs_a_bounded_number_of_round_trips(
    make_dispatcher, user, other_user, monkeypatch, django_assert_max_num_queries
):
    busy_service(make_dispatcher, [user, other_user])
    counting = CountingRedis(get_redis())
    monkeypatch.setattr(dashboard, "get_redis", lambda: counting)
    with django_assert_max_num_queries(SQL_QUERIES):
        snapshot = dashboard.gather()
    assert counting.round_trips <= REDIS_ROUND_TRIPS
    assert {(w.id, w.status) for w in snapshot.workers} == {("w-live", "live"), ("w-gone", "gone")}
    assert snapshot.queue_depth == 2 and snapshot.line["waiting"] == 2
    assert [r["user"] for r in snapshot.line["head"]] == [str(user.id), str(other_user.id)]
    assert snapshot.windows["5"]["ended"] == {"rejected:too_large": 2}
    assert {u["username"] for u in snapshot.users} == {"alice", "mallory"}
    assert snapshot.dead_total == 2 and [d.retryable for d in snapshot.dead] == [False, True]
    assert snapshot.samples and "ttft" in snapshot.samples[-1][1]
    # Later refreshes bring only the samples the page has not seen.
    assert dashboard.gather(since=snapshot.samples[-1][0]).samples == []


def test_the_page_is_for_staff_and_linked_from_the_admin_index(
    make_dispatcher, client_for, user, other_user
):
    busy_service(make_dispatcher, [user])
    assert client_for(other_user).get("/admin/ops/").status_code == 302
    other_user.is_staff = True
    other_user.save()
    client = client_for(other_user)
    assert "/admin/ops/" in client.get("/admin/").content.decode()
    page = client.get("/admin/ops/").content.decode()
    for shown in (
        "w-live",
        "w-gone",
        "status-gone",
        "Dead letters (2)",
        "rejected:too_large",
        "uPlot.iife.min.js",
        "ops-series-data",
        "alice",
    ):
        assert shown in page, shown
    live = client.get("/admin/ops/live/", {"since": "0-0"})
    assert live.status_code == 200 and 'class="queue-depth">1<' in live.content.decode()


def test_a_dead_letter_is_retried_onto_its_stream_or_discarded(
    make_dispatcher, client_for, staff, other_user
):
    busy_service(make_dispatcher, [other_user])
    client = client_for(staff)
    staff.is_superuser = True
    staff.save()
    dead = {fields["source"]: entry_id for entry_id, fields in get_redis().xrange(keys().dead)}
    before = get_redis().xlen(keys().admit)
    client.post(f"/admin/ops/dead/{dead['dispatcher']}/retry/")
    entries = get_redis().xrange(keys().admit)
    assert len(entries) == before + 1
    assert entries[-1][1]["id"] == "f" * 32 and "submit_by_ms" not in entries[-1][1]
    refused = client.post(f"/admin/ops/dead/{dead['recorder']}/retry/", follow=True)
    assert "cannot be retried" in refused.content.decode()
    client.post(f"/admin/ops/dead/{dead['recorder']}/discard/")
    assert get_redis().xlen(keys().dead) == 0
    assert (
        client_for(other_user).post(f"/admin/ops/dead/{dead['recorder']}/discard/").status_code
        == 302
    )


# What static/js/ops.js reads of each sample.
CHARTED = {"t", "dt", "run", "tokens", "failed", "queue", "ttft50", "ttft99", "e2e99"}


def test_the_series_json_is_what_the_charts_read(make_dispatcher, user):
    busy_service(make_dispatcher, [user])
    series = json.loads(json.dumps(dashboard.gather().series))  # as the page receives it
    [(newest, _)] = get_redis().xrevrange(keys().series, count=1)
    assert series["last"] == newest  # the next refresh asks for the samples after it
    assert series["samples"] and all(CHARTED <= set(sample) for sample in series["samples"])
    assert series["samples"][-1]["queue"] == 1  # the request waiting: the fleet has no slot


def test_the_plans_shed_are_those_the_dispatcher_sheds():
    from apps.admission.degradation import Degradation

    plans = [Plan(name="free", priority_weight=1), Plan(name="pro", priority_weight=4)]
    shedding = Degradation(level=3, reject_lowest_plan=True)
    snapshot = dashboard.Snapshot(
        at_ms=0,
        workers=[],
        state=None,
        degradation=shedding,
        queue_depth=0,
        samples=[],
        dead=[],
        dead_total=0,
        plans=plans,
    )
    assert [p.name for p in snapshot.shed_plans] == ["free"]
    snapshot.plans = plans[:1]  # a single plan is never shed
    assert snapshot.shed_plans == []
