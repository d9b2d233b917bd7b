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

from django.db import IntegrityError, transaction
from redis.exceptions import ResponseError

from chatsite.redis_client import get_redis
from worker import protocol
from worker.protocol import Completion, EventType, State, Usage

from .keys import keys
from .models import Conversation, Message

log = logging.getLogger("sluice.recorder")

STATUS_FOR_STATE = {
    State.DONE: Message.Status.DONE,
    State.CANCELLED: Message.Status.CANCELLED,
    State.FAILED: Message.Status.FAILED,
}


def completion_record(*, completion: Completion) -> Message | None:
    """Stores the answer (or the failure) as an assistant message; None if already stored or
    the conversation is gone."""
    conversation = Conversation.objects.filter(id=completion.conversation_id).first()
    if conversation is None:
        return None
    if completion.state == State.CANCELLED and not completion.text:
        return None  # stopped before any text: nothing worth keeping
    try:
        with transaction.atomic():
            message = Message.objects.create(
                conversation=conversation,
                role=Message.Role.ASSISTANT,
                text=completion.text,
                request_id=completion.id,
                prompt_tokens=completion.usage.prompt_tokens or None,
                completion_tokens=completion.usage.completion_tokens or None,
                status=STATUS_FOR_STATE[completion.state],
                error=completion.error[:300],
                citations=completion_citations(completion),
            )
            conversation.save(update_fields=["updated"])
    except IntegrityError:
        return None  # recorded already (a redelivery)
    return message


def completion_citations(completion: Completion) -> list:
    """Citations the web attached to the request when it was submitted."""
    raw = get_redis().hget(keys().request(completion.id), "citations")
    return json.loads(raw) if raw else []


def release_conversation(completion: Completion) -> None:
    """Lets the conversation take its next question (only if this request still holds it)."""
    k = keys()
    client = get_redis()
    active = k.conversation_active(completion.conversation_id)
    if client.get(active) == completion.id:
        client.delete(active)


def request_settle(*, request_id: str, conversation: Conversation) -> bool:
    """True when the request has ended: its answer is then stored (once) and the conversation
    released. False while it is still queued or generating."""
    entries = get_redis().xrevrange(keys().output(request_id), count=1)
    if not entries or entries[0][1].get("type") != EventType.FINAL:
        return False
    final = entries[0][1]
    completion = Completion(
        id=request_id, user_id=str(conversation.owner_id), conversation_id=str(conversation.id),
        state=State(final["state"]), text=final.get("text", ""),
        usage=Usage(**json.loads(final.get("usage") or "{}")), error=final.get("error", ""),
    )  # fmt: skip
    completion_record(completion=completion)
    release_conversation(completion)
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
    block_ms: int = 1000,
    count: int = 100,
    on_recorded: Callable[[Completion], None] | None = None,
) -> int:
    """One pass: records what is on the done stream for this consumer. Returns how many."""
    consumer = consumer or socket.gethostname()
    client = get_redis()
    k = keys()
    handled = 0
    # First anything delivered to this consumer before a crash, then new records.
    for start in ("0", ">"):
        block = None if start == "0" else block_ms
        response = client.xreadgroup(
            protocol.RECORDER_GROUP, consumer, {k.done: start}, count=count, block=block
        )
        for _, entries in response or []:
            for entry_id, fields in entries:
                try:
                    completion = Completion.from_fields(fields)
                except (KeyError, ValueError) as exc:
                    log.error("skipping malformed completion %s: %s", entry_id, exc)
                else:
                    completion_record(completion=completion)
                    release_conversation(completion)
                    if on_recorded:
                        on_recorded(completion)
                client.xack(k.done, protocol.RECORDER_GROUP, entry_id)
                handled += 1
    return handled
