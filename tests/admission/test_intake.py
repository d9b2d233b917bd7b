"""Intake as users see it: a decision at once, rejections that name their real reason, requests
held by their plan's rate, degradation's effects, withdrawn and unreadable entries."""

from __future__ import annotations

import json

import pytest

from apps.admission.models import Plan
from apps.admission.selectors import degradation_level, retrieval_degraded
from apps.admission.services import plan_assign
from contract import protocol, transitions
from contract.protocol import WorkItem, new_request_id
from core.redis_client import get_redis
from tests.admission.conftest import counters, events, final, force_level, keys, publish, state

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
    assert state(request_id) == "failed"
    assert counters()["requests:rejected:too_large"] == 1


def test_a_user_over_the_request_rate_waits_then_runs(make_dispatcher, user, clock):
    free_plan(burst_requests=1, requests_per_minute=60)
    first, second = publish(user.id), publish(user.id)
    dispatcher = make_dispatcher()
    dispatcher.step()
    assert dispatcher.line.requests[first].charged
    assert not dispatcher.line.requests[second].charged
    held = [e for e in events(second) if e.get("reason")]
    assert "limit on requests" in held[-1]["reason"]
    clock.now += 1.01
    dispatcher.step()
    assert dispatcher.line.requests[second].charged
    assert counters()["requests:admitted"] == 2


def test_a_spent_daily_quota_is_rejected_with_when_to_retry(make_dispatcher, user):
    free_plan(tokens_per_day=2000, burst_tokens=2000)
    first, second = publish(user.id, max_tokens=1000), publish(user.id, max_tokens=1000)
    make_dispatcher().step()
    assert final(first) is None
    end = final(second)
    assert end["state"] == "failed" and "today's tokens" in end["error"]
    assert int(end["retry_after"]) > 60
    assert counters()["requests:rejected:rate"] == 1


def test_degradation_caps_answers_then_sheds_the_lowest_plan(make_dispatcher, user, other_user):
    force_level(1)
    dispatcher = make_dispatcher()
    dispatcher.plans.refresh(force=True)
    dispatcher.publish_degradation()
    capped = publish(user.id, max_tokens=1000)
    dispatcher.step()
    assert dispatcher.line.requests[capped].fields["max_tokens"] == "256"
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
    assert kept in dispatcher.line
    assert degradation_level() == 3 and retrieval_degraded()
    assert counters()["requests:rejected:shed"] == 1


def submitted(user_id, *, submit_by_ms: int) -> WorkItem:
    """A request as the web hands it over, with the time it stops waiting for Redis."""
    item = WorkItem(
        id=new_request_id(),
        user_id=str(user_id),
        conversation_id="999999",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=64,
        prompt_tokens_estimate=100,
    )
    pipe = get_redis().pipeline(transaction=False)
    transitions.submitted(
        pipe, keys(), item, citations=[], stream=keys().admit, submit_by_ms=submit_by_ms
    )
    pipe.execute()
    return item


def test_an_entry_redis_took_after_the_web_gave_up_is_withdrawn_uncharged(make_dispatcher, user):
    # Redis was frozen: the web answered 503 and took the question back before Redis ran the
    # XADD. Running it now would answer a question the user was told had not been sent.
    withdrawn = submitted(user.id, submit_by_ms=protocol.now_ms() - 5000)
    kept = submitted(user.id, submit_by_ms=protocol.now_ms() + 5000)
    dispatcher = make_dispatcher()
    dispatcher.step()
    end = final(withdrawn.id)
    assert end["state"] == "cancelled" and end["text"] == "" and end["error"] == ""
    assert withdrawn.id not in dispatcher.line and kept.id in dispatcher.line
    records = [f for _, f in get_redis().xrange(keys().done) if f["id"] == withdrawn.id]
    assert [r["state"] for r in records] == ["cancelled"]  # the recorder releases the turn
    assert not get_redis().hexists(keys().charges, withdrawn.id)
    assert counters()["requests:withdrawn"] == 1
    assert counters()["requests:admitted"] == 1  # only the kept one was charged


def test_an_unreadable_entry_is_dead_lettered_and_the_rest_decided(make_dispatcher, user):
    bad = submitted(user.id, submit_by_ms=protocol.now_ms() + 5000)
    get_redis().delete(keys().admit)  # its entry is replaced by a garbled one
    garbled = {**bad.to_fields(), "max_tokens": "plenty"}
    get_redis().xadd(keys().admit, garbled)
    get_redis().xadd(keys().admit, {"v": protocol.PROTOCOL_VERSION, "id": "no-user"})
    good = publish(user.id)
    dispatcher = make_dispatcher()
    assert dispatcher.step() == 3
    assert good in dispatcher.line
    dead = [f for _, f in get_redis().xrange(keys().dead)]
    assert [d["request_id"] for d in dead] == [bad.id, "no-user"]
    assert all(d["source"] == "dispatcher" and d["stream"] == keys().admit for d in dead)
    assert "max_tokens" in json.loads(dead[0]["fields"]) and "ValueError" in dead[0]["reason"]
    assert "KeyError" in dead[1]["reason"]
    # Its user sees a failure, not a question queued forever.
    end = final(bad.id)
    assert end["state"] == "failed" and "could not read" in end["error"]
    assert get_redis().xlen(keys().admit) == 0  # acknowledged and deleted: never re-read
    assert counters()["requests:invalid"] == 2
