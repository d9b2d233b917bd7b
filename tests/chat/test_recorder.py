"""The answer recorder stores each answer once, however often its record is delivered, and
puts what it cannot read or store in the dead-letter stream without stopping."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.chat import recorder, submission
from apps.chat.models import Message
from apps.chat.services import conversation_create
from core.redis_client import get_redis, keys
from worker import protocol, transitions
from worker.protocol import Answer, State, Usage, WorkItem

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
    with the hot tier, the user's corpora and the models' fleet (their context windows) cached,
    as a busy chat has them."""
    from apps.admission.selectors import model_fleet
    from apps.chat.prompt import hot
    from apps.rag.selectors import searchable_corpora_for_user

    conversation = conversation_create(owner=user)
    answer = ended_request(conversation, request_id)
    recorder.ensure_group()
    get_redis().xadd(keys().done, answer.to_fields())
    hot.prompt_sources(conversation=conversation, limit=10)
    searchable_corpora_for_user(user=user)
    model_fleet(fresh=True)
    return conversation


@pytest.fixture
def fleet_cached(monkeypatch):
    """The fleet read once per process per FLEET_CACHE_SECONDS: kept for the whole test, so a
    slow machine does not count a refresh as the submit's own round trip."""
    from apps.admission import selectors

    monkeypatch.setattr(selectors, "FLEET_CACHE_SECONDS", 300.0)


@pytest.mark.parametrize("expected", ["r5", "another", None])
def test_the_next_question_settles_an_ended_answer_and_the_recorder_does_not_insert_it_again(
    user, expected
):
    """The web stores an ended answer itself when the next question comes first, reading its
    end along with the conversation's active request when it names the request it followed
    (or not, or a wrong one: then in a second round trip)."""
    conversation = conversation_create(owner=user)
    answer = ended_request(conversation, "r5")
    recorder.ensure_group()
    get_redis().xadd(keys().done, answer.to_fields())

    submission.ensure_conversation_free(conversation=conversation, expected=expected)

    stored = Message.objects.get(request_id="r5")
    assert (stored.role, stored.text) == ("assistant", "Blue.")
    assert submission.active_request_id(conversation=conversation) is None
    with CaptureQueriesContext(connection) as queries:
        assert recorder.record_pending(consumer="c1", block_ms=10) == 1
    # No message inserted again (the answer's usage is the recorder's to count: apps/usage).
    assert not [q for q in queries.captured_queries if "INSERT INTO chat_message" in q["sql"]]
    assert Message.objects.filter(conversation=conversation).count() == 1
    assert get_redis().xpending(keys().done, protocol.RECORDER_GROUP)["pending"] == 0


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
        submission.ensure_conversation_free(conversation=conversation, expected="r6")
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


def test_the_next_question_carries_the_settled_answers_writes_in_its_prompts_read(
    user, redis_round_trips, fleet_cached
):
    """The prompt's sources are read with the conversation's state, and the settled answer's
    skip mark, hot-tier turn and release ride with the publication, with the question's turn:
    two round trips, and the prompt still holds the answer before the question."""
    from apps.chat.prompt import hot

    conversation = warm_chat_with_an_ended_answer(user, "r7")

    redis_round_trips.clear()
    submitted = submission.request_submit(
        user=user, conversation=conversation, text="And at night?", expected="r7"
    )
    # Settle read (with the user's corpora and the prompt's sources), publish.
    assert len(redis_round_trips) == 2, redis_round_trips
    sent = get_redis().hgetall(keys().request(submitted.request_id))
    assert sent["conversation_id"] == str(conversation.id)
    assert turns_sent(submitted.request_id)[-2:] == [
        ("assistant", "Blue."),
        ("user", "And at night?"),
    ]
    prompt = hot.prompt_sources(conversation=conversation, limit=10)
    assert [t.text for t in prompt.history][:2] == ["And at night?", "Blue."]
    assert get_redis().hget(keys().request("r7"), "stored") == "1"
    with CaptureQueriesContext(connection) as queries:
        assert recorder.record_pending(consumer="c1", block_ms=10) == 1
    # No message inserted again (the answer's usage is the recorder's to count: apps/usage).
    assert not [q for q in queries.captured_queries if "INSERT INTO chat_message" in q["sql"]]


def turns_sent(request_id: str) -> list[tuple[str, str]]:
    """The (role, text) of the prompt a request was published with, system message left out."""
    import json

    entry = next(f for _, f in get_redis().xrange(keys().admit) if f["id"] == request_id)
    return [
        (m["role"], m["content"]) for m in json.loads(entry["messages"]) if m["role"] != "system"
    ]


def test_a_prompt_read_ahead_is_not_used_when_the_recorder_stored_the_answer_meanwhile(
    user, monkeypatch, redis_round_trips
):
    """The read ahead cannot hold an answer the recorder stored and pushed after it: the
    question's insert finds the answer stored, and the prompt is read again, after it."""
    from apps.chat import services
    from apps.chat.prompt import hot

    conversation = warm_chat_with_an_ended_answer(user, "r9")
    insert = services.question_create_after

    def recorder_first(**kwargs):
        assert recorder.record_pending(consumer="c1", block_ms=10) == 1
        return insert(**kwargs)

    monkeypatch.setattr(services, "question_create_after", recorder_first)
    redis_round_trips.clear()
    submitted = submission.request_submit(
        user=user, conversation=conversation, text="And at night?", expected="r9"
    )
    assert turns_sent(submitted.request_id)[-2:] == [
        ("assistant", "Blue."),
        ("user", "And at night?"),
    ]
    assert Message.objects.filter(request_id="r9").count() == 1
    history = hot.prompt_sources(conversation=conversation, limit=10).history
    assert [t.text for t in history][:2] == ["And at night?", "Blue."]


def test_a_prompt_read_ahead_holds_the_turns_the_recorder_stored_before(
    user, redis_round_trips, fleet_cached
):
    """A question to a conversation whose last answer was recorded already: two round trips,
    and the prompt holds every turn once, in order."""
    from apps.chat.prompt import hot

    conversation = warm_chat_with_an_ended_answer(user, "r10")
    assert recorder.record_pending(consumer="c1", block_ms=10) == 1
    redis_round_trips.clear()
    submitted = submission.request_submit(
        user=user, conversation=conversation, text="And at night?"
    )
    assert len(redis_round_trips) == 2, redis_round_trips
    sent = turns_sent(submitted.request_id)
    assert sent[-2:] == [("assistant", "Blue."), ("user", "And at night?")]
    assert [text for _, text in sent].count("Blue.") == 1
    history = hot.prompt_sources(conversation=conversation, limit=10).history
    assert [t.text for t in history][:2] == ["And at night?", "Blue."]


def test_a_question_refused_after_settling_still_writes_the_settled_answer(
    user, settings, monkeypatch
):
    """A submit that stops between settling the previous answer and its prompt's read (here:
    no worker serves the conversation's model) still writes what the settling owes Redis."""
    from apps.chat.prompt import hot

    conversation = conversation_create(owner=user)
    answer = ended_request(conversation, "r8")
    recorder.ensure_group()
    get_redis().xadd(keys().done, answer.to_fields())
    hot.prompt_sources(conversation=conversation, limit=10)
    conversation.model = "no-such-model"
    with pytest.raises(submission.ModelUnavailable):
        submission.request_submit(
            user=user, conversation=conversation, text="Hello?", expected="r8"
        )
    assert submission.active_request_id(conversation=conversation) is None
    assert get_redis().hget(keys().request("r8"), "stored") == "1"
    assert Message.objects.filter(request_id="r8").exists()
    history = hot.prompt_sources(conversation=conversation, limit=10).history
    assert [t.text for t in history] == ["Blue."]
    assert not Message.objects.filter(text="Hello?").exists()


def inserts(queries) -> list[str]:
    """Inserts of messages (the recorder also counts each answer's usage: apps/usage)."""
    return [q["sql"] for q in queries.captured_queries if "INSERT INTO chat_message" in q["sql"]]


def test_a_question_sent_as_its_answer_ends_stores_both_in_one_statement(user):
    """The answer the recorder has not stored yet goes into PostgreSQL with the question that
    follows it: one statement, the answer first in the conversation, and stored once."""
    conversation = conversation_create(owner=user)
    answer = ended_request(conversation, "r9")
    recorder.ensure_group()
    get_redis().xadd(keys().done, answer.to_fields())

    with CaptureQueriesContext(connection) as queries:
        submission.request_submit(
            user=user, conversation=conversation, text="And at night?", expected="r9"
        )
    assert len(inserts(queries)) == 1
    stored = list(conversation.messages.order_by("created", "id"))
    assert [(m.role, m.text) for m in stored] == [("assistant", "Blue."), ("user", "And at night?")]
    assert stored[0].created < stored[1].created
    assert get_redis().hget(keys().request("r9"), "stored") == "1"
    with CaptureQueriesContext(connection) as queries:
        assert recorder.record_pending(consumer="c1", block_ms=10) == 1
    assert not inserts(queries)


def test_a_question_whose_session_ended_still_stores_the_answer_it_follows(user):
    """The question's condition (its sender's session) fails: the answer in the same statement
    is stored all the same, and the conversation released."""
    from apps.accounts.sessions import SqlCondition

    conversation = conversation_create(owner=user)
    answer = ended_request(conversation, "r10")
    recorder.ensure_group()
    get_redis().xadd(keys().done, answer.to_fields())
    with pytest.raises(submission.QuestionNotStored):
        submission.request_submit(
            user=user,
            conversation=conversation,
            text="Still there?",
            expected="r10",
            only_if=SqlCondition("1 = 0", {}),
        )
    assert [m.role for m in conversation.messages.all()] == ["assistant"]
    assert get_redis().hget(keys().request("r10"), "stored") == "1"
    assert submission.active_request_id(conversation=conversation) is None


def test_an_answer_that_cannot_be_stored_does_not_keep_its_next_question_out(user, caplog):
    """The answer fails its insert (text PostgreSQL refuses): the question is stored on its
    own and sent; the answer is left to the recorder, which dead-letters it with the reason."""
    conversation = conversation_create(owner=user)
    ended_request(conversation, "r11", text="Blue\x00.")

    submitted = submission.request_submit(
        user=user, conversation=conversation, text="And at night?", expected="r11"
    )
    assert [m.text for m in conversation.messages.all()] == ["And at night?"]
    assert get_redis().hget(keys().request("r11"), "stored") is None
    assert submission.active_request_id(conversation=conversation) == submitted.request_id
    assert "answer r11 cannot be stored" in caplog.text


def test_a_failed_combined_insert_in_a_callers_transaction_leaves_it_usable(user, monkeypatch):
    """The statement fails in PostgreSQL (here: a division by zero stands in for it): inside
    the caller's transaction it ran under a savepoint, so the answer and the question are
    still stored one by one, the answer first."""
    from apps.chat import services

    conversation = conversation_create(owner=user)
    ended_request(conversation, "r12")
    monkeypatch.setattr(services, "_question_after_answer_sql", lambda only_if="": "SELECT 1/0")
    assert connection.in_atomic_block
    submission.request_submit(
        user=user, conversation=conversation, text="And at night?", expected="r12"
    )
    stored = [(m.role, m.text) for m in conversation.messages.order_by("created", "id")]
    assert stored == [("assistant", "Blue."), ("user", "And at night?")]
