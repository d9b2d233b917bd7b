"""The answer recorder stores each answer once, however often its record is delivered, and
puts what it cannot read or store in the dead-letter stream without stopping."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.chat import recorder, submission
from apps.chat.models import Message
from apps.chat.services import conversation_create, message_create
from contract import protocol, transitions
from contract.protocol import Answer, State, Usage, WorkItem
from core.redis_client import get_redis, keys

pytestmark = pytest.mark.django_db


def answer_for(conversation, *, request_id="r1", state=State.DONE, text="Blue."):
    return Answer(
        id=request_id,
        user_id=str(conversation.owner_id),
        conversation_id=str(conversation.id),
        state=state,
        text=text,
        usage=Usage(prompt_tokens=12, completion_tokens=3),
    )


def test_a_redelivered_answer_is_stored_once(user):
    conversation = conversation_create(owner=user)
    answer = answer_for(conversation)
    client = get_redis()
    recorder.ensure_group()
    for _ in range(3):  # the same record delivered three times
        client.xadd(keys().done, answer.to_fields())
    assert recorder.record_pending(consumer="c1", block_ms=10) == 3
    stored = Message.objects.get(request_id="r1")
    assert (stored.role, stored.text, stored.completion_tokens) == ("assistant", "Blue.", 3)
    assert Message.objects.filter(conversation=conversation).count() == 1


def test_records_left_pending_by_a_crashed_recorder_are_stored_on_restart(user):
    conversation = conversation_create(owner=user)
    recorder.ensure_group()
    get_redis().xadd(keys().done, answer_for(conversation, request_id="r2").to_fields())
    # Delivered to consumer c1, which "crashed" before acknowledging.
    get_redis().xreadgroup("recorder", "c1", {keys().done: ">"}, count=10)
    assert not Message.objects.filter(request_id="r2").exists()
    recorder.record_pending(consumer="c1", block_ms=10)
    assert Message.objects.filter(request_id="r2").exists()


def test_failures_are_kept_and_empty_stops_are_not(user):
    conversation = conversation_create(owner=user)
    failed = answer_for(conversation, request_id="f", state=State.FAILED, text="")
    failed.error = "The model failed: RuntimeError"
    stopped = answer_for(conversation, request_id="s", state=State.CANCELLED, text="")
    assert recorder.answer_store(answer=failed).status == "failed"
    assert recorder.answer_store(answer=stopped) is None
    assert Message.objects.get(request_id="f").error == "The model failed: RuntimeError"


def test_an_answer_for_a_deleted_conversation_is_dropped(user):
    conversation = conversation_create(owner=user)
    answer = answer_for(conversation)
    conversation.delete()
    assert recorder.answer_store(answer=answer) is None


def test_one_record_that_cannot_be_stored_does_not_hold_back_its_batch(user):
    conversation = conversation_create(owner=user)
    recorder.ensure_group()
    bad = answer_for(conversation, request_id="bad")
    bad.usage = Usage(prompt_tokens=-1, completion_tokens=3)  # breaks the column's check
    for answer in (
        answer_for(conversation, request_id="a"),
        bad,
        answer_for(conversation, request_id="b"),
    ):
        get_redis().xadd(keys().done, answer.to_fields())
    assert recorder.record_pending(consumer="c1", block_ms=10) == 3
    stored = Message.objects.filter(conversation=conversation).values_list("request_id", flat=True)
    assert set(stored) == {"a", "b"}
    # Kept for an operator with its reason, and acknowledged: it does not come back.
    dead = [fields for _, fields in get_redis().xrange(keys().dead)]
    assert [(d["source"], d["request_id"]) for d in dead] == [("recorder", "bad")]
    assert "cannot be stored" in dead[0]["reason"]
    assert recorder.record_pending(consumer="c1", block_ms=10) == 0
    # Stored directly (a new question settling the previous answer): dropped, not raised.
    assert recorder.answer_store(answer=bad) is None


def test_a_pass_without_pending_reads_only_new_records_and_a_recovery_drains_the_backlog(user):
    conversation = conversation_create(owner=user)
    recorder.ensure_group()
    client = get_redis()
    for n in range(5):
        client.xadd(keys().done, answer_for(conversation, request_id=f"p{n}").to_fields())
    client.xreadgroup(protocol.RECORDER_GROUP, "c1", {keys().done: ">"}, count=10)  # never stored
    client.xadd(keys().done, answer_for(conversation, request_id="new").to_fields())
    assert recorder.record_pending(consumer="c1", block_ms=None, pending=False) == 1
    stored = Message.objects.filter(conversation=conversation).values_list("request_id", flat=True)
    assert set(stored) == {"new"}
    # The backlog of five, read two at a time until a batch comes back short.
    assert recorder.record_pending(consumer="c1", block_ms=None, count=2) == 5
    assert Message.objects.filter(conversation=conversation).count() == 6


def test_a_pending_record_trimmed_from_the_stream_is_skipped(user):
    conversation = conversation_create(owner=user)
    recorder.ensure_group()
    client = get_redis()
    gone = client.xadd(keys().done, answer_for(conversation, request_id="gone").to_fields())
    client.xreadgroup(protocol.RECORDER_GROUP, "c1", {keys().done: ">"})
    client.xdel(keys().done, gone)  # as MAXLEN trimming would, while it was still pending
    client.xadd(keys().done, answer_for(conversation, request_id="kept").to_fields())
    assert recorder.record_pending(consumer="c1", block_ms=None) == 2
    assert list(Message.objects.values_list("request_id", flat=True)) == ["kept"]
    assert recorder.record_pending(consumer="c1", block_ms=None) == 0  # acknowledged


def test_a_malformed_record_is_dead_lettered_and_the_rest_stored(user):
    conversation = conversation_create(owner=user)
    recorder.ensure_group()
    client = get_redis()
    malformed = answer_for(conversation, request_id="m").to_fields()
    malformed["conversation_id"] = "not-a-number"
    client.xadd(keys().done, malformed)
    client.xadd(keys().done, {"id": "x"})  # not an answer at all
    client.xadd(keys().done, answer_for(conversation, request_id="ok").to_fields())
    assert recorder.record_pending(consumer="c1", block_ms=10) == 3
    assert list(Message.objects.values_list("request_id", flat=True)) == ["ok"]
    dead = [fields for _, fields in client.xrange(keys().dead)]
    assert sorted(d["request_id"] for d in dead) == ["m", "x"]
    assert all(d["reason"].startswith("malformed") for d in dead)
    assert recorder.record_pending(consumer="c1", block_ms=10) == 0


def ended_request(conversation, request_id: str, text: str = "Blue.") -> Answer:
    """A question's request, submitted and ended (as the dispatcher ends one), whose answer
    record the recorder has not read yet."""
    item = WorkItem(
        id=request_id,
        user_id=str(conversation.owner_id),
        conversation_id=str(conversation.id),
        messages=[{"role": "user", "content": "What colour is the sky?"}],
    )
    answer = answer_for(conversation, request_id=request_id, text=text)
    pipe = get_redis().pipeline(transaction=False)
    transitions.submitted(
        pipe, keys(), item, citations=[], stream=keys().admit, submit_by_ms=protocol.now_ms() + 5000
    )
    transitions.finish(pipe, keys(), answer)
    pipe.execute()
    return answer


def warm_chat_with_an_ended_answer(user, request_id: str):
    """A conversation whose answer has ended (its record on the done stream, not yet read),
    with the models' fleet (their context windows) read already, as a busy chat has it."""
    from apps.admission.selectors import model_fleet

    conversation = conversation_create(owner=user)
    answer = ended_request(conversation, request_id)
    recorder.ensure_group()
    get_redis().xadd(keys().done, answer.to_fields())
    model_fleet(fresh=True)
    return conversation


@pytest.fixture
def fleet_cached(monkeypatch):
    """The fleet read once per process per FLEET_CACHE_SECONDS: kept for the whole test, so a
    slow machine does not count a refresh as the submit's own round trip."""
    from apps.admission import selectors

    monkeypatch.setattr(selectors, "FLEET_CACHE_SECONDS", 300.0)


def test_a_question_after_an_ended_answer_stores_it_from_its_final_event_without_polling(
    user, redis_round_trips
):
    """The answer has ended but the recorder has not stored it yet: the web stores it from the
    final event it read (the record the recorder would store), in three round trips and no
    polling; the recorder's own store of it later is a no-op, and it still acknowledges it."""
    conversation = conversation_create(owner=user)
    answer = ended_request(conversation, "r5")
    recorder.ensure_group()
    get_redis().xadd(keys().done, answer.to_fields())

    redis_round_trips.clear()
    with CaptureQueriesContext(connection) as queries:
        stored_now = submission.ensure_conversation_free(conversation=conversation)
    assert stored_now
    assert len(inserts(queries)) == 1
    # the active request; its last event and its request's fields, in one pipeline
    assert len(redis_round_trips) == 2, redis_round_trips
    stored = Message.objects.get(request_id="r5")
    assert (stored.role, stored.text) == ("assistant", "Blue.")

    assert recorder.record_pending(consumer="c1", block_ms=None) == 1
    assert Message.objects.filter(request_id="r5").count() == 1
    assert get_redis().xpending(keys().done, protocol.RECORDER_GROUP)["pending"] == 0


def test_a_forgotten_request_does_not_hold_its_conversation(user):
    """Its state expired (Redis kept the conversation's key longer): nothing runs it any more,
    and nothing will release it, so the next question takes its place without waiting."""
    conversation = conversation_create(owner=user)
    get_redis().set(keys().conversation_active(conversation.id), "gone", ex=60)
    submitted = submission.request_submit(
        submission.Question(user=user, conversation=conversation, text="Hello?")
    )
    assert not conversation.messages.filter(role=Message.Role.ASSISTANT).exists()
    assert submission.active_request_id(conversation=conversation) == submitted.request_id


def test_an_answer_still_generating_keeps_the_conversation_busy(user):
    conversation = conversation_create(owner=user)
    item = WorkItem(
        id="r6",
        user_id=str(user.id),
        conversation_id=str(conversation.id),
        messages=[{"role": "user", "content": "Hi"}],
    )
    pipe = get_redis().pipeline(transaction=False)
    transitions.submitted(
        pipe, keys(), item, citations=[], stream=keys().admit, submit_by_ms=protocol.now_ms() + 5000
    )
    pipe.execute()
    with pytest.raises(submission.ConversationBusy):
        submission.ensure_conversation_free(conversation=conversation)
    assert not Message.objects.filter(request_id="r6").exists()


@pytest.fixture
def redis_round_trips(monkeypatch):
    """The web's round trips to Redis: the first command of each packet sent (a command alone,
    or a pipeline)."""
    import redis.connection

    sent: list[bytes] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def counting(self, command, check_health=True):
        packet = command if isinstance(command, bytes) else b"".join(command)
        sent.append(packet.split(b"\r\n")[2])
        return send(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    return sent


# committed for real, as the recorder and the web each commit their own
@pytest.mark.django_db(transaction=True)
def test_the_next_question_stores_the_ended_answer_and_its_prompt_holds_it_once(user, fleet_cached):
    """The ended answer, stored from its final event, is in the prompt, which is read after
    the question's insert and holds every turn once, in order."""
    from apps.chat import selectors

    conversation = warm_chat_with_an_ended_answer(user, "r7")
    submitted = submission.request_submit(
        submission.Question(user=user, conversation=conversation, text="And at night?")
    )
    sent = turns_sent(submitted.request_id)
    assert sent[-2:] == [("assistant", "Blue."), ("user", "And at night?")]
    assert [text for _, text in sent].count("Blue.") == 1
    history = selectors.prompt_sources(conversation=conversation, limit=10).history
    assert [t.text for t in history][:2] == ["And at night?", "Blue."]
    stored = list(conversation.messages.order_by("created", "id"))
    assert [(m.role, m.text) for m in stored] == [("assistant", "Blue."), ("user", "And at night?")]


@pytest.mark.django_db(transaction=True)
def test_the_recorder_skips_the_insert_of_an_answer_the_web_stored(user, fleet_cached):
    """The web marks the request it stored with the question it sends: the recorder's pass
    inserts no message for it, yet acknowledges its record and counts its usage."""
    conversation = warm_chat_with_an_ended_answer(user, "r12")
    submission.request_submit(
        submission.Question(user=user, conversation=conversation, text="And at night?")
    )
    with CaptureQueriesContext(connection) as queries:
        assert recorder.record_pending(consumer="c1", block_ms=None) == 1
    assert inserts(queries) == []
    assert any("usage" in q["sql"] for q in queries.captured_queries)
    assert Message.objects.filter(request_id="r12").count() == 1
    assert get_redis().xpending(keys().done, protocol.RECORDER_GROUP)["pending"] == 0


def turns_sent(request_id: str) -> list[tuple[str, str]]:
    """The (role, text) of the prompt a request was published with, system message left out."""
    import json

    entry = next(f for _, f in get_redis().xrange(keys().admit) if f["id"] == request_id)
    return [
        (m["role"], m["content"]) for m in json.loads(entry["messages"]) if m["role"] != "system"
    ]


# committed for real, as the recorder and the web each commit their own
@pytest.mark.django_db(transaction=True)
def test_a_question_after_a_recorded_answer_holds_it_in_two_round_trips(
    user, redis_round_trips, fleet_cached
):
    """A question to a conversation whose last answer was recorded already: two round trips,
    and the prompt holds every turn once, in order."""
    from apps.chat import selectors

    conversation = warm_chat_with_an_ended_answer(user, "r10")
    assert recorder.record_pending(consumer="c1", block_ms=10) == 1
    redis_round_trips.clear()
    submitted = submission.request_submit(
        submission.Question(user=user, conversation=conversation, text="And at night?")
    )
    assert len(redis_round_trips) == 2, redis_round_trips
    sent = turns_sent(submitted.request_id)
    assert sent[-2:] == [("assistant", "Blue."), ("user", "And at night?")]
    assert [text for _, text in sent].count("Blue.") == 1
    history = selectors.prompt_sources(conversation=conversation, limit=10).history
    assert [t.text for t in history][:2] == ["And at night?", "Blue."]


def inserts(queries) -> list[str]:
    """Inserts of messages (the recorder also counts each answer's usage: apps/usage)."""
    return [q["sql"] for q in queries.captured_queries if "INSERT INTO chat_message" in q["sql"]]


def test_an_answer_that_cannot_be_stored_does_not_keep_its_next_question_out(user, caplog):
    """The answer fails its insert (text PostgreSQL refuses): the question is stored and sent
    all the same, and the recorder dead-letters the answer's record with the reason."""
    conversation = conversation_create(owner=user)
    answer = ended_request(conversation, "r11", text="Blue\x00.")
    recorder.ensure_group()
    get_redis().xadd(keys().done, answer.to_fields())

    submitted = submission.request_submit(
        submission.Question(user=user, conversation=conversation, text="And at night?")
    )
    assert [m.text for m in conversation.messages.all()] == ["And at night?"]
    assert submission.active_request_id(conversation=conversation) == submitted.request_id
    assert "cannot be stored" in caplog.text
    recorder.record_pending(consumer="c1", block_ms=None)
    assert "dead-lettering answer record" in caplog.text
    assert submission.active_request_id(conversation=conversation) == submitted.request_id


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["regenerate", "edit"])
def test_an_answer_dropped_before_the_recorder_came_stays_dropped(user, fleet_cached, how):
    """Regenerate (or edit the question) as soon as an answer ends: the web stores the ended
    answer, then drops it; neither the new question's submit nor the recorder's pass brings it
    back."""
    from apps.chat import turns

    conversation = warm_chat_with_an_ended_answer(user, "r13")
    question = message_create(conversation=conversation, role="user", text="What colour?")
    conversation.messages.filter(id=question.id).update(created=question.created.replace(year=2000))
    if how == "regenerate":
        turns.answer_regenerate(user=user, conversation=conversation)
    else:
        turns.message_edit(
            user=user, conversation=conversation, message_id=question.id, text="What shade?"
        )
    assert not Message.objects.filter(request_id="r13").exists()
    recorder.record_pending(consumer="c1", block_ms=None)
    assert not Message.objects.filter(request_id="r13").exists()
