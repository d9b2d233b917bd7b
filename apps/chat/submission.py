"""Services that submit, stop and look up requests: the web's half of the request path.

A request's live state is the Redis hash `req:{id}` (see worker.protocol), written only through
worker.transitions; its answer is stored in PostgreSQL by the answer recorder, exactly once,
keyed by the request id.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from time import monotonic, sleep

from django.conf import settings
from django.http import Http404
from redis.exceptions import RedisError

from apps.accounts.models import User
from apps.accounts.sessions import SqlCondition
from apps.admission.kinds import web_kind
from apps.admission.selectors import model_fleet
from apps.chat import background, services, tab_sync
from apps.chat.models import Conversation, Message
from apps.chat.prompt.prompting import prompt_build
from apps.chat.publish import request_publish
from apps.rag.prompting import citations_from, passages_block
from apps.rag.services import RetrievalRefused, retrieve_for_prompt
from apps.streams.hub_base import Entry
from core.redis_client import get_redis, keys
from worker import protocol
from worker.protocol import EventType, WorkItem

log = logging.getLogger("sluice.chat.submission")


@dataclass
class Submitted:
    request_id: str
    conversation_id: int
    user_message: Message | None
    first_event: Entry | None = None  # the output stream's first entry, as published


class ConversationBusy(Exception):
    """The conversation already has an answer in progress."""


class ModelUnavailable(ConversationBusy):
    """No live worker serves the conversation's model right now: the question is not sent
    (it would only wait in line for a worker that is not there)."""


class QuestionNotStored(Http404):
    """The question's insert stored nothing: its conversation was deleted meanwhile, or the
    condition the caller gave it (`only_if`) no longer held. Nothing was sent."""


class QueueUnavailable(Exception):
    """Redis (the queue) cannot be reached: admission fails closed, and nothing is stored."""

    message = (
        "Sluice cannot take new questions right now (its queue is unreachable). Your message "
        "was not sent; please try again in a minute."
    )

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.message)


def active_request_id(*, conversation: Conversation) -> str | None:
    return get_redis().get(keys().conversation_active(conversation.id))


def ensure_conversation_free(*, conversation: Conversation, expected: str | None = None) -> bool:
    """Raises ConversationBusy while an answer is generating, QueueUnavailable when Redis
    cannot say. An answer that has ended is stored by the recorder alone, which releases the
    conversation once it has (apps/chat/recorder.py): a question sent before that waits for
    it, so its prompt holds that answer, and is told to try again only when the recorder takes
    longer than ANSWER_STORE_WAIT_SECONDS (it runs in the dispatcher, which may be failing
    over). Returns whether it waited. `expected`: the request the caller last followed in
    this conversation (a websocket's previous question), whose end is then read in the same
    round trip as the conversation's active request."""
    try:
        pipe = get_redis().pipeline(transaction=False)
        pipe.get(keys().conversation_active(conversation.id))
        if expected:
            _end_read(pipe, expected)
        active, *end = pipe.execute()
        if not active:
            return False
        if active != expected:
            pipe = get_redis().pipeline(transaction=False)
            _end_read(pipe, active)
            end = pipe.execute()
        entries, known = end
        if not known:
            return False  # forgotten (its state expired): the next request takes its place
        if not entries or entries[0][1].get("type") != EventType.FINAL:
            raise ConversationBusy("Wait for the current answer to finish, or stop it.")
        _wait_until_stored(conversation, active)
        return True
    except RedisError as exc:
        raise QueueUnavailable from exc


def _end_read(pipe, request_id: str) -> None:
    """Queues the reads that tell whether a request has ended: its last event, and whether
    its state is still known."""
    pipe.xrevrange(keys().output(request_id), count=1)
    pipe.exists(keys().request(request_id))


def _wait_until_stored(conversation: Conversation, request_id: str) -> None:
    """Until the recorder releases the conversation from `request_id` (it has stored the
    answer): usually a few milliseconds, so polled every millisecond at first (a GET each),
    then at growing intervals (a dispatcher failing over takes seconds). A wait past the first
    LONG_WAIT_SECONDS holds one of `_long_waits()`' places, or is told at once to send again when
    none is free."""
    key = keys().conversation_active(conversation.id)
    start = monotonic()
    pause = 0.001
    place = None
    try:
        while get_redis().get(key) == request_id:
            waited = monotonic() - start
            if waited > settings.ANSWER_STORE_WAIT_SECONDS:
                raise ConversationBusy(STILL_BEING_SAVED)
            if waited > LONG_WAIT_SECONDS and place is None:
                place = _long_waits()
                if not place.acquire(blocking=False):
                    place = None
                    raise ConversationBusy(STILL_BEING_SAVED)
            sleep(pause)
            if waited > 0.02:
                pause = min(pause * 2, 0.05)
    finally:
        if place is not None:
            place.release()


# The recorder stores an answer within one dispatcher pass (tens of milliseconds even with a
# hundred streams asking again the moment their answers end): a wait past a second means the
# dispatcher is away, failing over.
LONG_WAIT_SECONDS = 1.0
STILL_BEING_SAVED = (
    "Your last answer is still being saved. Please send your message again in a moment."
)


@functools.cache
def _long_waits() -> threading.BoundedSemaphore:
    """The waits for the recorder that outlast its usual milliseconds (a dispatcher failing
    over) each hold a thread of this process, the websocket's among WEB_DB_THREADS: at most
    half of those may wait at once, so other chats' database work always has threads."""
    return threading.BoundedSemaphore(max(1, settings.WEB_DB_THREADS // 2))


def ensure_model_served(*, model: str) -> None:
    """Raises ModelUnavailable when no live worker serves `model` ("": the default model,
    which the dispatcher picks among the live ones). The fleet is read at most once a second
    per process, so this costs nothing on the usual path."""
    if not model:
        return
    try:
        live = model in model_fleet().live or model in model_fleet(fresh=True).live
    except RedisError as exc:
        raise QueueUnavailable from exc
    if not live:
        raise ModelUnavailable(
            f"No worker serves the model {model!r} right now. Pick another "
            "model, or try again later."
        )


def request_submit(
    *,
    user: User,
    conversation: Conversation,
    text: str | None,
    kind: str = "chat",
    model: str | None = None,
    instruction: str = "",
    request_id: str | None = None,
    expected: str | None = None,
    announce: bool = False,
    only_if: SqlCondition | None = None,
    api_key: str = "",
) -> Submitted:
    """Stores the user's message (unless regenerating: text None), builds the prompt and hands
    the request to admission. `model`: the model to answer with, remembered as the
    conversation's (None: the conversation's own). `instruction`: a last user turn for this
    request only, never stored (turns.py's "continue"). Raises ValidationError for bad text,
    ConversationBusy when the conversation is still answering, QueueUnavailable when Redis
    cannot be reached. `request_id`: the id to give the request (None: a new one), for a
    caller that must know it before the request exists. `expected`: see
    ensure_conversation_free. `announce`: the question is published to the user's other tabs
    too (tab_sync.question_published), in the request's own round trip. `only_if`: a condition the
    question's insert checks in the same statement (the sender's login session,
    SessionCheck.condition); QuestionNotStored when it fails. Before that insert, only reads
    are made, and an answer that has ended is stored (as the recorder would store it anyway);
    so a question with `only_if` cannot change the conversation's model. `api_key`: the SHA-256
    of the API key the question came with, under which its usage is filed (apps/usage)."""
    if conversation.owner_id != user.id:
        raise Http404
    if only_if is not None and (text is None or model is not None):
        raise ValueError("only_if guards a new question's insert, with the conversation's model")
    ensure_conversation_free(conversation=conversation, expected=expected)
    prompt, passages, question, user_message = _question_and_prompt(
        user=user,
        conversation=conversation,
        text=text,
        model=model,
        instruction=instruction,
        only_if=only_if,
    )
    request_id = request_id or protocol.new_request_id()
    item = WorkItem(
        id=request_id,
        user_id=str(user.id),
        conversation_id=str(conversation.id),
        messages=prompt.messages,
        max_tokens=prompt.max_tokens,
        temperature=settings.MODEL_TEMPERATURE,
        prompt_tokens_estimate=prompt.prompt_tokens_estimate,
        kind=web_kind(requested=kind, passages=len(passages)),
        model=conversation.model,
    )
    # Published after the question is committed, so a worker never answers a question that was
    # rolled back; if Redis is down the question is taken back, so nothing half-sent remains.
    announcement = None
    if announce:
        announcement = functools.partial(
            tab_sync.question_event,
            conversation=conversation,
            message=user_message,
            request_id=request_id,
        )
    try:
        first_event = request_publish(
            item=item,
            also=announcement,
            citations=citations_from(passages, question=question),
            api_key=api_key,
        )
    except RedisError as exc:
        if user_message is not None:
            user_message.delete()
        raise QueueUnavailable from exc
    # After the person's request, so the summary it asks for queues behind it.
    background.summary_schedule(conversation=conversation, prompt=prompt)
    return Submitted(request_id, conversation.id, user_message, first_event)


def _question_and_prompt(*, user, conversation, text, model, instruction, only_if):
    """request_submit's middle part: the model, the question stored, the passages and the
    prompt."""
    if model is not None and model != conversation.model:
        services.conversation_set_model(conversation=conversation, model=model)
    ensure_model_served(model=conversation.model)
    user_message = None
    if text is not None:
        user_message = services.message_create(
            conversation=conversation, role=Message.Role.USER, text=text, only_if=only_if
        )
        if user_message is None:
            raise QuestionNotStored
    # Outside a transaction: plain reads need no BEGIN and COMMIT round trips, and the
    # question is committed already (it is taken back below if the request cannot be sent).
    try:
        question = text if text is not None else last_question(conversation=conversation)
        passages = passages_for(user=user, question=question)
        prompt = prompt_build(conversation=conversation, passages=passages_block(passages))
        if instruction:  # after the history, so the cached prefix of the turns still holds
            prompt.messages.append({"role": "user", "content": instruction})
    except Exception:
        if user_message is not None:
            user_message.delete()
        raise
    return prompt, passages, question, user_message


def last_question(*, conversation: Conversation) -> str:
    last = conversation.messages.filter(role=Message.Role.USER).order_by("-created", "-id").first()
    return last.text if last else ""


def passages_for(*, user: User, question: str) -> list:
    """Retrieved passages for the question; none (and the answer goes on without them) when
    retrieval fails, since a chat without sources beats no chat."""
    try:
        return retrieve_for_prompt(user=user, query=question)
    except RetrievalRefused as exc:  # RAG_EMBEDDING_UNAVAILABLE=refuse: nothing is sent
        raise QueueUnavailable(str(exc)) from exc
    except Exception:
        log.exception("retrieval failed; answering without passages")
        return []


def answer_regenerate(*, user: User, conversation: Conversation) -> Submitted:
    """Drops the last answer and asks again from the same history."""
    ensure_conversation_free(conversation=conversation)
    last = conversation.messages.order_by("-created", "-id").first()
    if last is None:
        raise ConversationBusy("There is nothing to regenerate yet.")
    if last.role == Message.Role.ASSISTANT:
        last.delete()
    return request_submit(user=user, conversation=conversation, text=None)
