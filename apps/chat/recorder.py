"""The answer recorder: stores every finished answer in PostgreSQL, exactly once.

Whatever ended a request (a worker, or the dispatcher for a request it never handed to one)
adds an answer record to the done stream after the final event; the recorder reads it through
its own consumer group, so answers are kept even when no browser is watching. The assistant
message's unique request id makes a record delivered twice a no-op. A record that cannot be
read or stored goes to the dead-letter stream with its reason: the loop never dies on data.

It releases a conversation (its active key) once the answer is stored. A question sent after
an answer ended but before the recorder stored it stores the answer itself from the final event
(submission.ensure_conversation_free, through answer_store): the same record, so whichever
stores second stores nothing; the web marks the request when it did, and the recorder then
skips the insert.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable

from django.db import DataError, IntegrityError, connection, transaction

from apps.chat import background, services
from apps.chat.models import Conversation, Message
from apps.rag.prompting import citations_used
from apps.usage import services as usage_services
from contract import protocol, transitions
from contract.protocol import Answer, State
from core.redis_client import get_redis, keys

log = logging.getLogger("sluice.recorder")

STATUS_FOR_STATE = {
    State.DONE: Message.Status.DONE,
    State.CANCELLED: Message.Status.CANCELLED,
    State.FAILED: Message.Status.FAILED,
}
# What a single answer can fail on when it is stored, as opposed to the database being away.
UNSTORABLE = (IntegrityError, DataError, ValueError)


def answer_store(*, answer: Answer, citations: list | None = None) -> Message | None:
    """Stores the answer (or the failure) as an assistant message; None if already stored, the
    conversation is gone, or it was stopped before any text. `citations` as the web attached
    them (read from the request's hash when not given)."""
    if citations is None:
        citations = answers_citations([answer])[0]
    new = answer_message(answer, citations)
    if new is None:
        return None
    try:
        return _store_one(new)
    except UNSTORABLE as exc:
        log.error("answer %s cannot be stored: %s", answer.id, exc)
        return None


def answer_message(
    answer: Answer, citations: list, *, cited: bool = False
) -> services.NewMessage | None:
    """The assistant message to store for `answer`; `cited`: `citations` are those the answer
    uses already (citations_used), else all the web attached."""
    if not answer.conversation_id:
        return None  # an API request: its caller keeps the conversation, Sluice stores none
    if answer.state == State.CANCELLED and not answer.text:
        return None  # stopped before any text (or withdrawn): nothing worth keeping
    return services.NewMessage(
        conversation=Conversation(id=int(answer.conversation_id)),
        role=Message.Role.ASSISTANT,
        text=answer.text,
        request_id=answer.id,
        prompt_tokens=answer.usage.prompt_tokens or None,
        completion_tokens=answer.usage.completion_tokens or None,
        status=STATUS_FOR_STATE[answer.state],
        error=answer.error[:300],
        citations=citations if cited else citations_used(citations, answer.text),
        finish_reason=answer.finish_reason[:16],
    )


# What the recorder reads of each request's hash, for the whole batch in one round trip:
# the citations the web attached, when and as what it was submitted (the inbox's "your answer is
# ready"), the purpose of Sluice's own background requests, the API key it came with (usage
# accounting), and whether the web stored the answer already (transitions.answer_stored).
REQUEST_FIELDS = ("citations", "created_ms", "kind", "purpose", "api_key", "stored")


def requests_read(answers: list[Answer]) -> list[dict[str, str | None]]:
    pipe = get_redis().pipeline(transaction=False)
    for answer in answers:
        pipe.hmget(keys().request(answer.id), REQUEST_FIELDS)
    return [dict(zip(REQUEST_FIELDS, row, strict=True)) for row in pipe.execute()]


def answers_citations(answers: list[Answer]) -> list[list]:
    """Citations the web attached to each request when it was submitted: one round trip."""
    return [_citations(fields["citations"]) for fields in requests_read(answers)]


def _citations(raw: str | None) -> list:
    return json.loads(raw) if raw else []


def release_conversations(answers: list[Answer], pipe=None) -> None:
    """Lets each conversation take its next question (only if this request still holds it).
    Queued on `pipe` when given (the caller executes it), else sent at once."""
    held = [answer for answer in answers if answer.conversation_id]
    if not held:
        return
    own = pipe is None
    pipe = get_redis().pipeline(transaction=False) if own else pipe
    for answer in held:
        transitions.conversation_released(
            pipe, keys(), conversation_id=answer.conversation_id, request_id=answer.id
        )
    if own:
        pipe.execute()


def ensure_group() -> None:
    pipe = get_redis().pipeline(transaction=False)
    transitions.ensure_groups(pipe, [(keys().done, protocol.RECORDER_GROUP)])
    transitions.check_groups(pipe.execute(raise_on_error=False))


def record_pending(
    *,
    consumer: str | None = None,
    block_ms: int | None = 1000,
    count: int = 100,
    on_recorded: Callable[[list[Answer]], None] | None = None,
    pending: bool = True,
) -> int:
    """One pass: records what is on the done stream for this consumer. Returns how many.

    With `pending`, first every record delivered to this consumer before but never
    acknowledged (a crash between reading and storing); then new records, waiting up to
    `block_ms` for one (None: not at all). Each batch read together is stored together: its
    citations, its answers, the release of its conversations and its acknowledgement take one
    round trip each.
    """
    consumer = consumer or socket.gethostname()
    client = get_redis()
    k = keys()
    handled = 0
    while pending:
        response = client.xreadgroup(protocol.RECORDER_GROUP, consumer, {k.done: "0"}, count=count)
        entries = response[0][1] if response else []
        handled += _record_batch(entries, on_recorded)
        pending = len(entries) == count  # a full batch: more may be waiting
    response = client.xreadgroup(
        protocol.RECORDER_GROUP, consumer, {k.done: ">"}, count=count, block=block_ms
    )
    for _, entries in response or []:
        handled += _record_batch(entries, on_recorded)
    return handled


def _record_batch(
    entries: list[tuple[str, dict]], on_recorded: Callable[[list[Answer]], None] | None
) -> int:
    if not entries:
        return 0
    parsed, rejected = _parsed(entries)
    answers = [answer for _, answer in parsed]
    requests = requests_read(answers) if parsed else []
    if parsed:
        cited = [
            citations_used(_citations(fields["citations"]), answer.text)
            if fields["citations"] and fields["citations"] != "[]"
            else []
            for answer, fields in zip(answers, requests, strict=True)
        ]
        messages = [
            (entry_id, answer_message(answer, citations, cited=True))
            for (entry_id, answer), citations, fields in zip(parsed, cited, requests, strict=True)
            if not fields["stored"]
        ]
        usage = usage_services.usage_rows(
            answers,
            requests,
            [[c["chunk_id"] for c in citations if "chunk_id" in c] for citations in cited],
            now_ms=protocol.now_ms(),
        )
        rejected += _store([(i, m) for i, m in messages if m is not None], usage)
        background.answers_ready_post(answers, requests=requests)
        # Background answers go to their task instead of the conversation; chat answers may
        # ask for follow-ups.
        background.answers_recorded(answers, requests=requests)
        if on_recorded:
            on_recorded(answers)
    pipe = get_redis().pipeline(transaction=False)
    # Even an answer that could not be kept ends its turn; the conversations are released in
    # the acknowledgement's round trip, after their answers were stored, so the next
    # question's prompt holds them.
    release_conversations(answers, pipe)
    fields_of = dict(entries)
    for entry_id, reason in rejected:
        log.error("dead-lettering answer record %s: %s", entry_id, reason)
        transitions.dead_letter(
            pipe,
            keys(),
            source="recorder",
            reason=reason,
            stream=keys().done,
            entry_id=entry_id,
            fields=fields_of.get(entry_id) or {},
        )
    # Acknowledged once stored: a crash before this re-reads them, and storing twice is a no-op.
    pipe.xack(keys().done, protocol.RECORDER_GROUP, *(entry_id for entry_id, _ in entries))
    pipe.execute()
    return len(entries)


def _store(
    messages: list[tuple[str, services.NewMessage]], usage: list[dict] | None = None
) -> list[tuple[str, str]]:
    """The batch in one round trip, with the usage of every answer read (apps/usage) in the
    same transaction, so a crash or a failover never stores one without the other; if one
    answer cannot be stored (its conversation deleted that instant, a figure out of range),
    the others one by one, so one bad record never holds back the rest, nor comes back
    forever. Returns (entry id, reason) of those not stored."""
    if not messages:  # one statement is atomic on its own: no BEGIN and COMMIT trips
        usage_services.usage_record(rows=usage or [])
        return []
    if len(messages) == 1 and not usage:
        return _store_each(messages)
    try:
        with transaction.atomic():  # all or none, so the fallback below starts clean
            usage_services.usage_record(rows=usage or [])
            services.messages_store([m for _, m in messages])
        return []
    except UNSTORABLE:
        with transaction.atomic():
            usage_services.usage_record_alone(rows=usage or [])
            return _store_each(messages)


def _store_each(messages: list[tuple[str, services.NewMessage]]) -> list[tuple[str, str]]:
    failed = []
    for entry_id, message in messages:
        try:
            _store_one(message)
        except UNSTORABLE as exc:
            failed.append((entry_id, f"cannot be stored: {exc.__class__.__name__}: {exc}"))
    return failed


def _store_one(message: services.NewMessage) -> Message | None:
    if not connection.in_atomic_block:  # one statement: atomic on its own
        return services.message_store(message)
    with transaction.atomic():  # a savepoint, so a failure leaves the caller's open
        return services.message_store(message)


def _parsed(entries: list[tuple[str, dict | None]]) -> tuple[list, list[tuple[str, str]]]:
    """(entry id, Answer) for each readable record, and (entry id, reason) for the others."""
    parsed, rejected = [], []
    for entry_id, fields in entries:
        if not fields:  # pending, but trimmed from the stream since: nothing left to store
            log.error("skipping answer record %s: trimmed before it was stored", entry_id)
            continue
        try:
            answer = Answer.from_fields(fields)
            int(answer.user_id)
            if answer.conversation_id:  # "" for an API request: settled, not stored
                int(answer.conversation_id)
        except (KeyError, ValueError, TypeError) as exc:
            rejected.append((entry_id, f"malformed: {exc.__class__.__name__}: {exc}"))
            continue
        parsed.append((entry_id, answer))
    return parsed, rejected
