"""The completion recorder: stores every finished answer in PostgreSQL, exactly once.

Workers add a record to the done stream after the final event; the recorder reads it through its
own consumer group, so answers are kept even when no browser is watching. The assistant
message's unique request id makes a record delivered twice a no-op.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable

from django.db import IntegrityError, connection, transaction
from redis.exceptions import ResponseError

from chatsite.redis_client import get_redis
from worker import protocol
from worker.protocol import Completion, EventType, State, Usage

from . import services
from .keys import keys
from .models import Conversation, Message

log = logging.getLogger("sluice.recorder")

STATUS_FOR_STATE = {
    State.DONE: Message.Status.DONE,
    State.CANCELLED: Message.Status.CANCELLED,
    State.FAILED: Message.Status.FAILED,
}


def completion_record(*, completion: Completion, citations: list | None = None) -> Message | None:
    """Stores the answer (or the failure) as an assistant message; None if already stored, the
    conversation is gone, or it was stopped before any text. `citations` as the web attached
    them (read from the request's hash when not given)."""
    if citations is None:
        citations = completions_citations([completion])[0]
    new = completion_message(completion, citations)
    return _store_one(new) if new is not None else None


def completion_message(completion: Completion, citations: list) -> services.NewMessage | None:
    if completion.state == State.CANCELLED and not completion.text:
        return None  # stopped before any text: nothing worth keeping
    return services.NewMessage(
        conversation=Conversation(id=int(completion.conversation_id)),
        role=Message.Role.ASSISTANT,
        text=completion.text,
        request_id=completion.id,
        prompt_tokens=completion.usage.prompt_tokens or None,
        completion_tokens=completion.usage.completion_tokens or None,
        status=STATUS_FOR_STATE[completion.state],
        error=completion.error[:300],
        citations=citations,
    )


def completions_citations(completions: list[Completion]) -> list[list]:
    """Citations the web attached to each request when it was submitted: one round trip."""
    pipe = get_redis().pipeline(transaction=False)
    for completion in completions:
        pipe.hget(keys().request(completion.id), "citations")
    return [json.loads(raw) if raw else [] for raw in pipe.execute()]


# Deletes the key only while it still holds this request: no race with a new question that
# took the conversation meanwhile.
RELEASE_IF_HELD = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def release_conversations(completions: list[Completion]) -> None:
    """Lets each conversation take its next question (only if this request still holds it)."""
    pipe = get_redis().pipeline(transaction=False)
    for completion in completions:
        active = keys().conversation_active(completion.conversation_id)
        pipe.eval(RELEASE_IF_HELD, 1, active, completion.id)
    pipe.execute()


def request_settle(*, request_id: str, conversation: Conversation) -> bool:
    """True when the request has ended: its answer is then stored (once) and the conversation
    released. False while it is still queued or generating."""
    pipe = get_redis().pipeline(transaction=False)
    pipe.xrevrange(keys().output(request_id), count=1)
    pipe.hget(keys().request(request_id), "citations")
    entries, cited = pipe.execute()
    if not entries or entries[0][1].get("type") != EventType.FINAL:
        return False
    final = entries[0][1]
    completion = Completion(
        id=request_id, user_id=str(conversation.owner_id), conversation_id=str(conversation.id),
        state=State(final["state"]), text=final.get("text", ""),
        usage=Usage(**json.loads(final.get("usage") or "{}")), error=final.get("error", ""),
    )  # fmt: skip
    completion_record(completion=completion, citations=json.loads(cited) if cited else [])
    release_conversations([completion])
    return True


def ensure_group() -> None:
    try:
        get_redis().xgroup_create(keys().done, protocol.RECORDER_GROUP, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def record_pending(
    *,
    consumer: str | None = None,
    block_ms: int | None = 1000,
    count: int = 100,
    on_recorded: Callable[[list[Completion]], None] | None = None,
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
        response = client.xreadgroup(protocol.RECORDER_GROUP, consumer, {k.done: "0"},
                                     count=count)  # fmt: skip
        entries = response[0][1] if response else []
        handled += _record_batch(entries, on_recorded)
        pending = len(entries) == count  # a full batch: more may be waiting
    response = client.xreadgroup(protocol.RECORDER_GROUP, consumer, {k.done: ">"}, count=count,
                                 block=block_ms)  # fmt: skip
    for _, entries in response or []:
        handled += _record_batch(entries, on_recorded)
    return handled


def _record_batch(
    entries: list[tuple[str, dict]], on_recorded: Callable[[list[Completion]], None] | None
) -> int:
    if not entries:
        return 0
    completions = _parsed(entries)
    if completions:
        cited = zip(completions, completions_citations(completions), strict=True)
        answers = [completion_message(c, citations) for c, citations in cited]
        _store([a for a in answers if a is not None])
        release_conversations(completions)
        if on_recorded:
            on_recorded(completions)
    # Acknowledged once stored: a crash before this re-reads them, and storing twice is a no-op.
    get_redis().xack(keys().done, protocol.RECORDER_GROUP, *(entry_id for entry_id, _ in entries))
    return len(entries)


def _store(answers: list[services.NewMessage]) -> None:
    """The batch in one round trip; if one answer cannot be stored (its conversation deleted
    that instant, a malformed usage figure), the others one by one, so one bad record never
    holds back the rest, nor comes back forever."""
    try:
        with transaction.atomic():  # all or none, so the fallback below starts clean
            services.messages_store(answers)
    except IntegrityError:
        for answer in answers:
            _store_one(answer)


def _store_one(answer: services.NewMessage) -> Message | None:
    try:
        if not connection.in_atomic_block:  # one statement: atomic on its own
            return services.message_store(answer)
        with transaction.atomic():  # a savepoint, so a failure leaves the caller's open
            return services.message_store(answer)
    except IntegrityError as exc:
        log.error("dropping answer %s that cannot be stored: %s", answer.request_id, exc)
        return None


def _parsed(entries: list[tuple[str, dict | None]]) -> list[Completion]:
    completions = []
    for entry_id, fields in entries:
        if not fields:  # pending, but trimmed from the stream since: nothing left to store
            log.error("skipping completion %s: its record was trimmed before it was stored",
                      entry_id)  # fmt: skip
            continue
        try:
            completions.append(Completion.from_fields(fields))
        except (KeyError, ValueError) as exc:
            log.error("skipping malformed completion %s: %s", entry_id, exc)
    return completions
