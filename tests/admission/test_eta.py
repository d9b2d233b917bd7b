"""Queue ETAs from what is left to do: the running answers' predicted lengths less what they
have decoded, and the predicted lengths of the requests ahead, at each model's measured speed;
learned from the answers, kept for the dispatcher that takes over."""

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


def answered(
    dispatcher, request_ids, *, seconds: float, worker_id: str, model: str, tokens: int = 10
) -> None:
    """A worker of `model` took the items off its stream, and answered each with `tokens`
    in `seconds`."""
    client = get_redis()
    for entry_id, fields in client.xrange(keys().work_for_model(model)):
        if fields.get("id") in request_ids:
            client.xdel(keys().work_for_model(model), entry_id)
    for request_id in request_ids:
        worker_answers(
            request_id, completion_tokens=tokens, duration_ms=seconds * 1000, worker_id=worker_id
        )
    dispatcher.step()


def ask(user_id, model: str, *, max_tokens: int = 16) -> str:
    from apps.chat.submission import request_publish
    from contract.protocol import WorkItem, new_request_id

    item = WorkItem(
        id=new_request_id(),
        user_id=str(user_id),
        conversation_id="999999",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=max_tokens,
        model=model,
    )
    request_publish(item=item)
    return item.id


def test_the_eta_follows_each_models_measured_speed(make_dispatcher, user, other_user):
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
    # Every answer is predicted at its 16 tokens (too few answered yet to learn lengths). Fast:
    # 10 tokens in 2 s, so 3.2 s an answer on each of 2 slots; slow: 10 in 30 s, 48 s on 1.
    assert [eta(r) for r in fast] == [3, 3, 6, 6]
    assert [eta(r) for r in slow] == [48, 96]
    # The slow model speeds up: its ETAs follow, as a moving average of the speed (0.8 x 1/3 +
    # 0.2 x 2 tokens/s), not the last answer alone. The first in line has gone to the freed
    # slot, just started: 16 tokens at 2/3 token/s are left of it.
    answered(dispatcher, busy[2:], seconds=5, worker_id="w-slow", model="slow")
    dispatcher.step()
    assert slow[0] not in dispatcher.line
    assert eta(slow[1]) == 24


def test_the_eta_counts_what_is_left_of_the_long_answers_running(
    make_dispatcher, user, other_user, clock
):
    roomy_plan(max_concurrent=10, model_names=[])
    serve("w", "m", 2)
    dispatcher = make_dispatcher()
    # A run of short answers: 20 tokens in 1 s each.
    short = [ask(user.id, "m", max_tokens=20) for _ in range(2)]
    dispatcher.step()
    answered(dispatcher, short, seconds=1, tokens=20, worker_id="w", model="m")
    # Two long answers take both slots, then someone waits behind them.
    running = [ask(user.id, "m", max_tokens=400) for _ in range(2)]
    dispatcher.step()
    waiting = ask(other_user.id, "m", max_tokens=400)
    dispatcher.step()
    assert not any(r in dispatcher.line for r in running) and waiting in dispatcher.line
    # 400 tokens at 20 tokens/s are left of each: 20 s (the moving average of the service
    # time said 1/2 x 1 s).
    assert eta(waiting) == 20
    # Fifteen seconds on, 100 tokens are left: the page hears so, in the same place.
    clock.now += 15
    dispatcher.step()
    assert eta(waiting) == 5
    assert {e["position"] for e in events(waiting) if e.get("position")} == {"1"}


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
    # 16 tokens at 10 tokens in 40 s: the standby knows the speed and the answer running (not
    # the 10 s a dispatcher guesses before its first answer).
    assert eta(waiting) == 64
