"""The dispatcher's recorder pass (run_dispatcher composes it): new answer records every pass,
the backlog after a load or a failure, each answer handed to the dispatcher to settle."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from apps.chat import recorder
from apps.chat.models import Message
from apps.chat.services import conversation_create
from apps.ops.management.commands.run_dispatcher import RecorderPass
from contract import protocol
from contract.protocol import ACTIVE_CONSUMER, Answer, State, Usage
from core.redis_client import get_redis, keys

pytestmark = pytest.mark.django_db


def finished(conversation, request_id: str) -> None:
    answer = Answer(
        id=request_id,
        user_id=str(conversation.owner_id),
        conversation_id=str(conversation.id),
        state=State.DONE,
        text="Blue.",
        usage=Usage(prompt_tokens=5, completion_tokens=2),
    )
    get_redis().xadd(keys().done, answer.to_fields())


def read_but_not_stored(conversation, request_id: str) -> None:
    """A record the lease holder read and then lost (a crash, a lost lease)."""
    finished(conversation, request_id)
    get_redis().xreadgroup(protocol.RECORDER_GROUP, ACTIVE_CONSUMER, {keys().done: ">"})


def stored(request_id: str) -> bool:
    return Message.objects.filter(request_id=request_id).exists()


def test_the_backlog_is_read_after_each_load_and_after_a_failed_pass(user):
    conversation = conversation_create(owner=user)
    recorder.ensure_group()
    settled = []
    dispatcher = SimpleNamespace(loads=1, settle=settled.extend)
    recorder_pass = RecorderPass()

    read_but_not_stored(conversation, "a")
    assert recorder_pass(dispatcher) == 1  # the first pass recovers
    assert stored("a") and [a.id for a in settled] == ["a"]

    read_but_not_stored(conversation, "b")
    assert recorder_pass(dispatcher) == 0  # same load: new records only
    assert not stored("b")
    dispatcher.loads = 2
    assert recorder_pass(dispatcher) == 1  # reloaded: the backlog again
    assert stored("b")

    finished(conversation, "c")
    finished(conversation, "d")

    def fail(answers):
        raise ConnectionError("Redis went away")

    dispatcher.settle = fail
    with pytest.raises(ConnectionError):
        recorder_pass(dispatcher)  # reads c and d, fails before acknowledging them
    dispatcher.settle = settled.extend
    assert recorder_pass(dispatcher) == 2  # so the next pass recovers both
    assert [a.id for a in settled][-2:] == ["c", "d"]


def test_a_pass_that_admitted_requests_and_saw_no_answer_skips_the_recorder(make_dispatcher, user):
    """A pass that admitted new requests, none of them left waiting, and saw no answer record
    runs the recorder at most every `record_interval`. A pass with nothing new runs it, and so
    does every pass while a request waits for a slot (settling the answers frees the slots)."""
    from tests.admission.conftest import give_the_fleet_slots, publish

    dispatcher = make_dispatcher(record_interval=3600)
    recorded = []
    real_pass = dispatcher.recorder_pass
    dispatcher.recorder_pass = lambda d: recorded.append(len(d.line)) or real_pass(d)
    give_the_fleet_slots(2)

    publish(user.pk)
    dispatcher.step()
    assert len(recorded) == 1  # the first pass: due
    publish(user.pk)
    dispatcher.step()
    assert len(recorded) == 1  # admitted, nothing waits: not due yet
    dispatcher.step()
    assert len(recorded) == 2  # nothing new
    publish(user.pk)  # both slots are taken: this one waits in line
    dispatcher.step()
    assert recorded[-1] == 1 and len(recorded) == 3


def test_an_answer_record_ends_the_wait_for_new_requests_and_is_stored_in_that_pass(
    make_dispatcher, user
):
    """An answer is stored as soon as it ends (pages and the inbox read it from PostgreSQL), so
    an answer record ends a pass's wait for new requests, and that pass stores it even while
    requests keep arriving (the recorder not due by time)."""
    from tests.admission.conftest import give_the_fleet_slots, publish

    dispatcher = make_dispatcher(block_ms=600_000, record_interval=3600)
    give_the_fleet_slots(2)
    publish(user.pk)
    dispatcher.step()  # loads, and records what is due
    conversation = conversation_create(owner=user)

    finished(conversation, "woke")
    assert dispatcher.intake.read(block_ms=600_000) == []  # no new request, yet no wait
    assert len(dispatcher.intake.answers_seen) == 1

    finished(conversation, "stored")
    publish(user.pk)  # admitted in the same pass
    dispatcher.step()
    assert stored("stored") and stored("woke")
    # The dispatcher's own reads of the done stream are acknowledged: nothing piles up.
    assert get_redis().xpending(keys().done, protocol.DISPATCHER_GROUP)["pending"] == 0
