"""The sweep: stops and queue-wait deadlines reach each waiting request, wherever it waits in a
long line, and a request that runs out of time is told the real reason."""

from __future__ import annotations

import pytest

from apps.admission.models import Plan
from apps.admission.services import plan_assign
from contract import transitions
from core.redis_client import get_redis
from tests.admission.conftest import counters, final, keys, publish, queue_many, roomy_plan

pytestmark = pytest.mark.django_db


def stop(request_id: str) -> None:
    """The user presses Stop, as the web does it."""
    pipe = get_redis().pipeline(transaction=False)
    transitions.stopped(pipe, keys(), request_id)
    pipe.execute()


def test_a_request_no_worker_took_in_time_fails_saying_so(make_dispatcher, user, clock):
    Plan.objects.filter(slug="free").update(max_queue_wait_seconds=5)
    request_id = publish(user.id)
    dispatcher = make_dispatcher()
    dispatcher.step()
    assert final(request_id) is None
    clock.now += 6
    dispatcher.step()
    end = final(request_id)
    assert end["state"] == "failed" and "without a free worker" in end["error"]
    assert end["retry_after"] == "60"
    assert request_id not in dispatcher.line
    assert not get_redis().hexists(keys().queue, request_id)
    assert counters()["requests:timed_out:no_worker"] == 1


def test_a_request_its_plans_rate_held_past_its_deadline_is_told_the_rate(
    make_dispatcher, user, clock
):
    # As reported: told "waited 2 s without a free worker" while 32 slots were idle. It was
    # its plan's request rate that held it: that is what the user must read.
    Plan.objects.filter(slug="free").update(
        burst_requests=1, requests_per_minute=15, max_queue_wait_seconds=5
    )
    first, second, held = publish(user.id), publish(user.id), publish(user.id)
    dispatcher = make_dispatcher()
    dispatcher.step()  # the first is charged; one request every 4 s: the others are held
    assert dispatcher.line.requests[first].charged
    clock.now += 4.01
    dispatcher.step()  # the second is charged
    dispatcher.step()  # the third is held 4 s more: past its 5 s
    assert dispatcher.line.requests[second].charged
    assert not dispatcher.line.requests[held].charged
    clock.now += 2
    dispatcher.step()
    end = final(held)
    assert end["state"] == "failed"
    assert "faster than your plan allows" in end["error"] and "worker" not in end["error"]
    assert 1 <= int(end["retry_after"]) <= 10
    assert counters()["requests:timed_out:rate"] == 1


def test_a_request_charged_late_by_its_plans_rate_is_told_the_rate_held_it(
    make_dispatcher, user, clock
):
    # Its token came 4 s into a 5 s wait: the second left to reach a worker ran out, and
    # "waited 5 s without a free worker" would hide that the rate took the other four.
    Plan.objects.filter(slug="free").update(
        burst_requests=1, requests_per_minute=15, max_queue_wait_seconds=5
    )
    first, second = publish(user.id), publish(user.id)
    dispatcher = make_dispatcher()
    dispatcher.step()
    clock.now += 4.01
    dispatcher.step()
    assert dispatcher.line.requests[second].charged
    clock.now += 2
    dispatcher.step()
    late = final(second)
    assert late["state"] == "failed" and late["code"] == "no_worker"
    assert "rate held this request for 4 s" in late["error"], late["error"]
    assert "which left it 1 s to reach a worker" in late["error"]
    # The first was charged at once: no worker is its whole story.
    assert "without a free worker" in final(first)["error"]
    assert counters()["requests:timed_out:no_worker"] == 2


def test_stop_while_queued_cancels(make_dispatcher, user):
    request_id = publish(user.id)
    dispatcher = make_dispatcher()
    dispatcher.step()
    get_redis().set(keys().cancel(request_id), "1", ex=60)
    dispatcher.step()
    assert final(request_id)["state"] == "cancelled"
    assert request_id not in dispatcher.line
    assert counters()["requests:cancelled"] == 1


def test_a_request_stopped_in_the_queue_gets_its_tokens_back(make_dispatcher, user):
    # 400 tokens at once, refilled at one a second: a second 300-token request would wait
    # minutes unless the first one's charge comes back.
    Plan.objects.filter(slug="free").update(burst_tokens=400, tokens_per_minute=60)
    first = publish(user.id, prompt_tokens=100, max_tokens=200)
    dispatcher = make_dispatcher()
    dispatcher.step()
    assert dispatcher.line.requests[first].charged
    stop(first)
    dispatcher.step()  # cancelled: its charge goes to the charges hash, its record to the done
    assert final(first)["state"] == "cancelled"
    dispatcher.step()  # the recorder's pass settles it: all 300 tokens come back
    second = publish(user.id, prompt_tokens=100, max_tokens=200)
    dispatcher.step()
    assert dispatcher.line.requests[second].charged


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
    assert impatient not in dispatcher.line
    assert not get_redis().hexists(keys().queue, impatient)
    assert set(dispatcher.line.requests) == set(before + after)  # the others still wait


def test_a_stop_deep_in_a_long_queue_ends_the_request_at_the_next_sweep(
    make_dispatcher, user, other_user
):
    roomy_plan()
    ids = queue_many([user, other_user], 150)
    # Far fewer flags read per sweep than requests wait: the note is what finds this stop.
    dispatcher = make_dispatcher(cancel_checks=5)
    dispatcher.step()
    deep = ids[250]
    stop(deep)
    dispatcher.step()
    assert final(deep)["state"] == "cancelled"
    assert deep not in dispatcher.line
    assert not get_redis().hexists(keys().queue, deep)
    assert len(dispatcher.line) == 299
    assert get_redis().scard(keys().cancels) == 0
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
    assert deep not in dispatcher.line and len(dispatcher.line) == 299
