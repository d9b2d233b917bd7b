"""Queue ETAs from measured service times: per model, learned from the answers, kept for the
dispatcher that takes over."""

from __future__ import annotations

import json
import time

import pytest

from core.redis_client import get_redis
from tests.admission.conftest import events, keys, roomy_plan, worker_answers

pytestmark = pytest.mark.django_db


def serve(worker_id: str, model: str, slots: int, running=()) -> None:
    beat = {
        "worker_id": worker_id,
        "slots": slots,
        "busy": len(running),
        "healthy": True,
        "running": list(running),
        "model": model,
    }
    client = get_redis()
    client.set(keys().heartbeat(worker_id), json.dumps(beat), ex=60)
    client.zadd(keys().workers, {worker_id: time.time()})


def eta(request_id: str) -> int:
    told = [e for e in events(request_id) if e.get("position")]
    return int(told[-1]["eta_seconds"])


def answered(dispatcher, request_ids, *, seconds: float, worker_id: str, model: str) -> None:
    """A worker of `model` took the items off its stream, and answered each in `seconds`."""
    client = get_redis()
    for entry_id, fields in client.xrange(keys().work_for_model(model)):
        if fields.get("id") in request_ids:
            client.xdel(keys().work_for_model(model), entry_id)
    for request_id in request_ids:
        worker_answers(
            request_id, completion_tokens=10, duration_ms=seconds * 1000, worker_id=worker_id
        )
    dispatcher.step()


def ask(user_id, model: str) -> str:
    from apps.chat.submission import request_publish
    from worker.protocol import WorkItem, new_request_id

    item = WorkItem(
        id=new_request_id(),
        user_id=str(user_id),
        conversation_id="999999",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=16,
        model=model,
    )
    request_publish(item=item)
    return item.id


def test_the_eta_follows_each_models_measured_service_time(make_dispatcher, user, other_user):
    roomy_plan(max_concurrent=10, model_names=[])
    serve("w-fast", "fast", 2)
    serve("w-slow", "slow", 1)
    dispatcher = make_dispatcher()
    # Each model's slots fill, and the answers say how long each model takes.
    first = [ask(user.id, "fast"), ask(user.id, "fast"), ask(user.id, "slow")]
    dispatcher.step()
    answered(dispatcher, first[:2], seconds=2, worker_id="w-fast", model="fast")
    answered(dispatcher, first[2:], seconds=30, worker_id="w-slow", model="slow")
    # Both models busy again, then a line forms behind each.
    busy = [ask(user.id, "fast"), ask(user.id, "fast"), ask(user.id, "slow")]
    dispatcher.step()
    fast = [ask(other_user.id, "fast") for _ in range(4)]
    slow = [ask(other_user.id, "slow") for _ in range(2)]
    dispatcher.step()
    assert not any(r in dispatcher.line for r in busy)
    # Place over slots times the model's own time: 1/2 x 2 s ... 4/2 x 2 s; 1 x 30 s, 2 x 30 s.
    assert [eta(r) for r in fast] == [1, 2, 3, 4]
    assert [eta(r) for r in slow] == [30, 60]
    # The slow model speeds up: its ETAs follow, as a moving average (0.8 x 30 s + 0.2 x 5 s),
    # not the last answer alone. The first in line has gone to the freed slot.
    answered(dispatcher, busy[2:], seconds=5, worker_id="w-slow", model="slow")
    dispatcher.step()
    assert slow[0] not in dispatcher.line
    assert eta(slow[1]) == 25


def test_the_ops_page_shows_each_models_service_time(make_dispatcher, user, client_for):
    roomy_plan(max_concurrent=10, model_names=[])
    serve("w-slow", "slow", 1)
    dispatcher = make_dispatcher()
    request_id = ask(user.id, "slow")
    dispatcher.step()
    answered(dispatcher, [request_id], seconds=12.5, worker_id="w-slow", model="slow")
    user.is_staff = user.is_superuser = True
    user.save()
    page = client_for(user).get("/admin/ops/live/").content.decode()
    assert "12.5 s" in page and ">slow<" in page


def test_a_new_dispatcher_tells_the_same_etas(make_dispatcher, user):
    roomy_plan(max_concurrent=10, model_names=[])
    serve("w-slow", "slow", 1)
    first = make_dispatcher()
    running = ask(user.id, "slow")
    first.step()
    answered(first, [running], seconds=40, worker_id="w-slow", model="slow")
    busy = ask(user.id, "slow")
    first.step()
    first.release_lease()
    waiting = ask(user.id, "slow")
    standby = make_dispatcher()
    standby.step()
    assert busy not in standby.line
    assert eta(waiting) == 40  # not the 10 s a dispatcher guesses before its first answer
