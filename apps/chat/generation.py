"""Services that start, stop and look up generations: the web's half of the request path.

A request's live state is the Redis hash `req:{id}` (see worker.protocol); the answer itself is
stored in PostgreSQL by the completion recorder, exactly once, keyed by the request id.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from django.conf import settings
from django.http import Http404
from redis.exceptions import RedisError

from apps.accounts.models import User
from apps.admission.services import request_cancel_signal
from apps.rag.prompting import citations_from, passages_block
from apps.rag.services import retrieve_for_prompt
from chatsite.redis_client import get_redis
from worker import protocol
from worker.protocol import Keys, State, WorkItem

from . import recorder, services
from .keys import keys
from .models import Conversation, Message
from .prompting import prompt_build

log = logging.getLogger("sluice.chat.generation")


@dataclass
class Submitted:
    request_id: str
    conversation_id: int
    user_message: Message | None


class GenerationBusy(Exception):
    """The conversation already has an answer in progress."""


class GenerationUnavailable(Exception):
    """Redis (the queue) cannot be reached: admission fails closed, and nothing is stored."""

    message = (
        "Sluice cannot take new questions right now (its queue is unreachable). Your message "
        "was not sent; please try again in a minute."
    )


def active_request_id(*, conversation: Conversation) -> str | None:
    return get_redis().get(keys().conversation_active(conversation.id))


def ensure_conversation_free(*, conversation: Conversation) -> None:
    """Raises GenerationBusy while an answer is generating. An answer that has ended but that
    the recorder has not stored yet is stored here (idempotently), so a question sent right
    after an answer never waits for the recorder and its prompt includes that answer."""
    active = active_request_id(conversation=conversation)
    if active and not recorder.request_settle(request_id=active, conversation=conversation):
        raise GenerationBusy("Wait for the current answer to finish, or stop it.")


def generation_submit(
    *, user: User, conversation: Conversation, text: str | None, kind: str = "chat"
) -> Submitted:
    """Stores the user's message (unless regenerating: text None), builds the prompt and hands
    the request to admission. Raises ValidationError for bad text, GenerationBusy when the
    conversation is still answering."""
    if conversation.owner_id != user.id:
        raise Http404
    try:
        ensure_conversation_free(conversation=conversation)
    except RedisError as exc:
        raise GenerationUnavailable(GenerationUnavailable.message) from exc
    request_id = protocol.new_request_id()
    user_message = None
    if text is not None:
        user_message = services.message_create(
            conversation=conversation, role=Message.Role.USER, text=text
        )
    # Outside a transaction: plain reads need no BEGIN and COMMIT round trips, and the
    # question is committed already (it is taken back below if the request cannot be sent).
    try:
        question = text if text is not None else last_question(conversation=conversation)
        passages = passages_for(user=user, question=question)
        prompt = prompt_build(conversation=conversation, extra_system=passages_block(passages))
    except Exception:
        if user_message is not None:
            user_message.delete()
        raise
    item = WorkItem(
        id=request_id,
        user_id=str(user.id),
        conversation_id=str(conversation.id),
        messages=prompt.messages,
        max_tokens=prompt.max_tokens,
        temperature=settings.MODEL_TEMPERATURE,
        prompt_tokens_estimate=prompt.prompt_tokens_estimate,
        kind=kind,
    )
    # Published after the question is committed, so a worker never answers a question that was
    # rolled back; if Redis is down the question is taken back, so nothing half-sent remains.
    try:
        request_publish(item=item, citations=citations_from(passages))
    except RedisError as exc:
        if user_message is not None:
            user_message.delete()
        raise GenerationUnavailable(GenerationUnavailable.message) from exc
    return Submitted(request_id, conversation.id, user_message)


def last_question(*, conversation: Conversation) -> str:
    last = conversation.messages.filter(role=Message.Role.USER).order_by("-created", "-id").first()
    return last.text if last else ""


def passages_for(*, user: User, question: str) -> list:
    """Retrieved passages for the question; none (and the answer goes on without them) when
    retrieval fails, since a chat without sources beats no chat."""
    try:
        return retrieve_for_prompt(user=user, query=question)
    except Exception:
        log.exception("retrieval failed; answering without passages")
        return []


def request_publish(*, item: WorkItem, citations: list | None = None) -> None:
    k = keys()
    cited = json.dumps(citations or [])
    pipe = get_redis().pipeline(transaction=False)
    pipe.hset(k.request(item.id), mapping={
        "state": State.QUEUED, "user_id": item.user_id, "conversation_id": item.conversation_id,
        "created_ms": protocol.now_ms(), "updated_ms": protocol.now_ms(), "citations": cited,
    })  # fmt: skip
    pipe.expire(k.request(item.id), protocol.REQUEST_TTL_SECONDS)
    pipe.set(k.conversation_active(item.conversation_id), item.id,
             ex=protocol.REQUEST_TTL_SECONDS)  # fmt: skip
    pipe.xadd(k.output(item.id), protocol.status_event(State.QUEUED, citations=cited),
              maxlen=protocol.OUTPUT_MAXLEN, approximate=True)  # fmt: skip
    pipe.expire(k.output(item.id), protocol.OUTPUT_TTL_SECONDS)
    pipe.xadd(submit_stream(k), item.to_fields())
    pipe.execute()


def submit_stream(k: Keys) -> str:
    """Where new requests go: the work stream directly (admission control comes in front of it
    when SLUICE_ADMISSION is on)."""
    return k.admit if settings.SLUICE_ADMISSION else k.work


def generation_regenerate(*, user: User, conversation: Conversation) -> Submitted:
    """Drops the last answer and asks again from the same history."""
    ensure_conversation_free(conversation=conversation)
    last = conversation.messages.order_by("-created", "-id").first()
    if last is None:
        raise GenerationBusy("There is nothing to regenerate yet.")
    if last.role == Message.Role.ASSISTANT:
        last.delete()
    return generation_submit(user=user, conversation=conversation, text=None)


@dataclass
class RequestInfo:
    id: str
    user_id: int
    conversation_id: int
    state: str


def request_get_for_user(*, user: User, request_id: str) -> RequestInfo:
    """The request's live state; Http404 when it is unknown, expired or someone else's."""
    if not request_id or len(request_id) > 64:
        raise Http404
    data = get_redis().hgetall(keys().request(request_id))
    if not data or data.get("user_id") != str(user.id):
        raise Http404
    return RequestInfo(request_id, int(data["user_id"]), int(data["conversation_id"]),
                       data.get("state", ""))  # fmt: skip


def generation_cancel(*, user: User, request_id: str) -> RequestInfo:
    """Stops the request: a worker checks the flag between batches and frees its slot; the
    dispatcher ends it at once if it is still waiting in line."""
    info = request_get_for_user(user=user, request_id=request_id)
    if info.state not in {s.value for s in protocol.TERMINAL_STATES}:
        request_cancel_signal(request_id=request_id)
    return info
