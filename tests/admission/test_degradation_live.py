"""Two workers running SmolLM2 on this machine's CPU, the real dispatcher, and more questions at
once than the workers have slots: the service still degrades as designed, from the pressure
people feel (the backlog of their requests), while the workers' own decoding is not a signal.
Background work asked meanwhile waits in line instead of being refused, and runs once the line
is quiet again."""

from __future__ import annotations

import pytest

from apps.accounts.services import user_create
from apps.admission.models import DegradationSettings
from apps.admission.selectors import degradation_get
from apps.chat import background
from apps.chat.services import conversation_create
from apps.chat.submission import Question, request_submit
from core.redis_client import get_redis, keys
from tests.chat.test_openai_api import roomy
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ENDED = ("done", "failed", "cancelled")


def state(request_id: str) -> str:
    return get_redis().hget(keys().request(request_id), "state") or ""


def test_two_workers_on_one_box_under_real_load_degrade_from_the_backlog(
    settings, dispatcher, start_worker, user
):
    settings.MODEL_MAX_TOKENS, settings.MODEL_TEMPERATURE = 32, 0.0
    roomy(max_queue_wait_seconds=900)  # a slow machine makes them wait; none may give up
    row = DegradationSettings.current()
    row.backlog_threshold, row.forced_level = 2, None
    row.save()
    start_worker("load-w1")
    start_worker("load-w2")
    wait_until(lambda: len(get_redis().zrange(keys().workers, 0, -1)) == 2, what="two workers")
    people = [user, user_create(username="bob", password="correct-horse-battery")]
    asked = [
        request_submit(
            Question(user=person, conversation=conversation_create(owner=person), text=question)
        ).request_id
        # Twelve answers of up to 32 tokens for two slots: the backlog of two or more lasts
        # about four answers' time per slot, so two or more of the dispatcher's two-second
        # publishings see it even where SmolLM2 writes a token in 30 ms (eight answers of 8
        # tokens drained in under two seconds on such a machine, between two publishings).
        for question in (
            "What is a river?",
            "What is a canal?",
            "What is a lake?",
            "What is a bay?",
            "What is a delta?",
            "What is a fjord?",
        )
        for person in people
    ]
    suggestion = background.background_submit(
        user_id=user.id,
        purpose={"task": "followups", "conversation": 0, "wait_s": 600},
        messages=[{"role": "user", "content": "Suggest a question about rivers."}],
        max_tokens=8,
    )

    degraded = wait_until(
        lambda: (level := degradation_get()).level >= 1 and level,
        timeout=60,
        what="the dispatcher to degrade",
    )
    assert degraded.signals["backlog"] >= 1  # people's requests waiting for the two slots
    assert degraded.signals["cpu"] < 1  # the workers' decoding is not the service's CPU
    assert degraded.sources["backlog"].startswith("people's requests waiting for a worker")
    assert state(suggestion) not in ENDED  # deferred, not refused

    wait_until(
        lambda: all(state(r) in ENDED for r in asked), timeout=600, what="every person's answer"
    )
    assert [state(r) for r in asked] == ["done"] * len(asked)
    wait_until(lambda: state(suggestion) in ENDED, timeout=120, what="the background request")
    assert state(suggestion) == "done"  # ran once the line was quiet
    wait_until(lambda: degradation_get().level == 0, timeout=30, what="level 0 again")
    assert "requests:rejected:background" not in get_redis().hgetall(keys().metrics)
