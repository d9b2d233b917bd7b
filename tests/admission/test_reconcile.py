"""Reconcile: answers settle their charges and free their users' slots; requests whose answer
record or whose worker was lost still end, visibly, exactly once."""

from __future__ import annotations

import pytest

from apps.admission.models import Plan
from apps.chat.models import Message
from apps.chat.services import conversation_create
from contract import transitions
from core.redis_client import get_redis
from tests.admission.conftest import (
    counters,
    final,
    give_the_fleet_slots,
    keys,
    publish,
    state,
    worker_answers,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversation(user):
    return conversation_create(owner=user)


def dispatched(dispatcher, user, conversation, **sizes) -> str:
    """A request handed to a worker's stream."""
    give_the_fleet_slots(4)
    request_id = publish(user.id, conversation=conversation.id, **sizes)
    dispatcher.step()
    assert state(request_id) == "dispatched"
    return request_id


def test_an_answer_that_used_less_than_its_estimate_gets_the_difference_back(
    make_dispatcher, user, conversation
):
    # 400 tokens at once, refilled at one a second: a second 300-token request would wait
    # minutes unless the first gives back what it did not use.
    Plan.objects.filter(slug="free").update(burst_tokens=400, tokens_per_minute=60)
    dispatcher = make_dispatcher()
    first = dispatched(dispatcher, user, conversation, prompt_tokens=100, max_tokens=200)
    worker_answers(first, prompt_tokens=60, completion_tokens=40)
    dispatcher.step()  # the recorder's pass stores the answer and settles it
    assert Message.objects.get(request_id=first).text == "Hi there."
    assert dispatcher.running.count(str(user.id)) == 0
    assert counters()["tokens:free"] == 100
    second = publish(user.id, prompt_tokens=100, max_tokens=200)
    dispatcher.step()
    assert state(second) == "dispatched"


def started_then_lost(request_id: str) -> None:
    """A worker started the request, then vanished with it: its heartbeat expired and the work
    item is gone (Redis restarted from a snapshot taken after the item was read)."""
    pipe = get_redis().pipeline(transaction=False)
    transitions.start(pipe, keys(), request_id, token="t-lost", worker_id="w-test")
    pipe.execute()
    get_redis().delete(keys().heartbeat("w-test"), keys().work)


def test_a_request_nothing_runs_any_more_fails_with_a_clear_message(
    make_dispatcher, user, conversation, clock
):
    dispatcher = make_dispatcher()
    request_id = dispatched(dispatcher, user, conversation)
    started_then_lost(request_id)
    clock.now += 10  # within the grace after dispatch: not looked at yet
    dispatcher.step()
    dispatcher.step()
    assert state(request_id) == "streaming"
    clock.now += 6
    dispatcher.step()  # lost, once...
    assert state(request_id) == "streaming"
    dispatcher.step()  # ...and again: it ends
    end = final(request_id)
    assert end["state"] == "failed"
    assert (
        end["error"] == "The server running this answer stopped before it finished. "
        "Please try again."
    )
    assert dispatcher.running.count(str(user.id)) == 0
    assert not get_redis().hexists(keys().running, request_id)
    assert counters()["requests:lost"] == 1
    dispatcher.step()  # the recorder stores the failure
    assert Message.objects.get(request_id=request_id).status == Message.Status.FAILED


def test_a_request_on_a_work_stream_or_on_a_live_worker_is_left_running(
    make_dispatcher, user, other_user, conversation, clock
):
    dispatcher = make_dispatcher()
    waiting = dispatched(dispatcher, user, conversation)  # on the stream, not read yet
    running = dispatched(dispatcher, other_user, conversation)
    started_then_lost(running)
    give_the_fleet_slots(4, running=[running])  # a worker runs it after all (it was paused)
    get_redis().xadd(keys().work, {"id": waiting})
    clock.now += 60
    for _ in range(3):
        dispatcher.step()
    assert state(waiting) == "dispatched"
    assert state(running) == "streaming"
    assert "requests:lost" not in counters()


def test_an_answer_whose_record_was_lost_is_recorded_and_settled(
    make_dispatcher, user, conversation, clock
):
    dispatcher = make_dispatcher()
    request_id = dispatched(dispatcher, user, conversation, prompt_tokens=100, max_tokens=200)
    worker_answers(request_id, completion_tokens=20, record=False)
    dispatcher.step()
    assert not Message.objects.filter(request_id=request_id).exists()
    clock.now += 16
    dispatcher.step()
    dispatcher.step()  # ended without a record, twice: the record is rebuilt from the end
    dispatcher.step()  # which the recorder stores
    message = Message.objects.get(request_id=request_id)
    assert message.text == "Hi there." and message.status == Message.Status.DONE
    assert dispatcher.running.count(str(user.id)) == 0
    assert counters()["tokens:free"] == 20


def test_a_request_whose_state_expired_is_forgotten(make_dispatcher, user, conversation, clock):
    dispatcher = make_dispatcher()
    request_id = dispatched(dispatcher, user, conversation)
    get_redis().delete(keys().request(request_id))
    clock.now += 16
    dispatcher.step()
    dispatcher.step()
    assert dispatcher.running.count(str(user.id)) == 0
    assert not get_redis().hexists(keys().charges, request_id)
    assert final(request_id) is None  # nobody is left to tell
