"""The dispatcher's recorder pass (run_dispatcher composes it): new answer records every pass,
the backlog after a load or a failure, each answer handed to the dispatcher to settle."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from apps.chat import recorder
from apps.chat.models import Message
from apps.chat.services import conversation_create
from apps.ops.management.commands.run_dispatcher import RecorderPass
from chatsite.redis_client import get_redis, keys
from worker import protocol
from worker.protocol import ACTIVE_CONSUMER, Answer, State, Usage

pytestmark = pytest.mark.django_db


def finished(conversation, request_id: str) -> None:
    answer = Answer(
        id=request_id, user_id=str(conversation.owner_id), conversation_id=str(conversation.id),
        state=State.DONE, text="Blue.", usage=Usage(prompt_tokens=5, completion_tokens=2),
    )  # fmt: skip
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
