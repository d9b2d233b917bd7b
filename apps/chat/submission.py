"""The one way a person's request is submitted: the page's websocket and form, the REST API,
regenerate, continue and edit all call `request_submit` with a `Question`; the OpenAI API and
Sluice's background work hand their own prompts to publish.request_publish, the one place a
request enters Redis.

A request's live state is the Redis hash `req:{id}` (see contract.protocol), written only through
contract.transitions; its answer is stored in PostgreSQL keyed by the request id, exactly once.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from django.conf import settings
from django.core.exceptions import ValidationError
from django.http import Http404
from redis.exceptions import RedisError

from apps.accounts.models import User
from apps.accounts.sessions import SqlCondition
from apps.admission.kinds import web_kind
from apps.admission.selectors import model_fleet
from apps.chat import background, recorder, services, tab_sync
from apps.chat.models import Conversation, Message
from apps.chat.prompt.prompting import prompt_build
from apps.chat.publish import request_publish
from apps.rag.prompting import citations_from, passages_block
from apps.rag.services import Retrieval, RetrievalRefused, retrieval_for_prompt
from apps.streams.hub_base import Entry
from contract import protocol, transitions
from contract.protocol import EventType, WorkItem
from core.redis_client import get_redis, keys

log = logging.getLogger("sluice.chat.submission")


@dataclass
class Question:
    """What a person's request is: who asks, in which conversation, and what."""

    user: User
    conversation: Conversation
    # The new question; None to answer the conversation as it stands (regenerate, continue).
    text: str | None = None
    # A last user turn for this request only, never stored (continue's instruction).
    instruction: str = ""
    # The model to answer with, remembered as the conversation's (None: the conversation's own).
    model: str | None = None
    # The SHA-256 of the API key it came with, under which its usage is filed (apps/usage).
    api_key: str = ""
    # Known before the request exists, so the websocket that sends it follows it from the start.
    request_id: str = field(default_factory=protocol.new_request_id)
    # For the user's other tabs: an edit's first replaced message; a new conversation's first.
    replaces: int | None = None
    new: bool = False


@dataclass
class Submitted:
    request_id: str
    conversation_id: int
    user_message: Message | None
    first_event: Entry | None = None  # the output stream's first entry, as published
    notice: str = ""  # what the person is told beside the answer (retrieval unavailable)


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


# What a submit may be refused with; every caller tells it through `refusal_of`.
REFUSALS = (ValidationError, Http404, ConversationBusy, QueueUnavailable)


@dataclass(frozen=True)
class Refusal:
    """A refused submit as every way in tells it."""

    message: str
    status: int  # for the HTTP callers
    retry_after: int | None = None  # seconds, for a 503's Retry-After
    draft_kept: bool = False  # nothing was stored: the composer gets the text back


def refusal_of(exc: Exception) -> Refusal:
    """How a refused submit is told, the same on every way in."""
    if isinstance(exc, ValidationError):
        return Refusal(" ".join(exc.messages), 400)
    if isinstance(exc, Http404):
        return Refusal(str(exc) or "This conversation no longer exists.", 404)
    if isinstance(exc, ModelUnavailable):
        return Refusal(str(exc), 503, retry_after=30, draft_kept=True)
    if isinstance(exc, ConversationBusy):
        return Refusal(str(exc), 409)
    if isinstance(exc, QueueUnavailable):
        return Refusal(str(exc), 503, retry_after=60, draft_kept=True)
    raise TypeError(f"not a submit refusal: {exc!r}")


def active_request_id(*, conversation: Conversation) -> str | None:
    return get_redis().get(keys().conversation_active(conversation.id))


def ensure_conversation_free(*, conversation: Conversation) -> str | None:
    """Raises ConversationBusy while an answer is generating, QueueUnavailable when Redis
    cannot say. An answer that has ended but is not stored yet (the recorder stores it within
    a dispatcher pass) is stored here from its final event, the record the recorder would store
    (a second store of one request id is a no-op): the next question's prompt holds it, and
    nothing waits on another process. Returns the id of the ended answer it stored (None when
    there was none, or it was stored before or could not be)."""
    try:
        active = get_redis().get(keys().conversation_active(conversation.id))
        if not active:
            return None
        pipe = get_redis().pipeline(transaction=False)
        pipe.xrevrange(keys().output(active), count=1)
        # user_id is written with every request: None means its state expired.
        pipe.hmget(keys().request(active), ["user_id", "citations", "stored"])
        entries, (known, citations, stored_before) = pipe.execute()
    except RedisError as exc:
        raise QueueUnavailable from exc
    if known is None:
        return None  # forgotten (its state expired): the next request takes its place
    if stored_before:
        return None  # stored by an earlier question, or dropped since (answers_dropped)
    if not entries or entries[0][1].get("type") != EventType.FINAL:
        raise ConversationBusy("Wait for the current answer to finish, or stop it.")
    answer = protocol.answer_from_final(
        active,
        entries[0][1],
        user_id=str(conversation.owner_id),
        conversation_id=str(conversation.id),
    )
    stored = recorder.answer_store(
        answer=answer, citations=json.loads(citations) if citations else []
    )
    return active if stored is not None else None


def answers_dropped(request_ids: list[str]) -> None:
    """Answers the person drops (regenerate, an edit of an earlier question), marked before
    they are deleted: one that ended moments ago may not be recorded yet, and neither the next
    question's submit nor the recorder then stores it again."""
    if not request_ids:
        return
    try:
        pipe = get_redis().pipeline(transaction=False)
        for request_id in request_ids:
            transitions.answer_stored(pipe, keys(), request_id)
        pipe.execute()
    except RedisError as exc:
        raise QueueUnavailable from exc


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


def request_submit(question: Question, *, only_if: SqlCondition | None = None) -> Submitted:
    """Stores the question (unless it is None: regenerate, continue), builds the prompt, hands
    the request to admission and tells the user's other tabs, in the request's own round trip
    (after the question is committed). Raises one of REFUSALS (refusal_of says how to tell it):
    ValidationError for bad text, ConversationBusy while the conversation is still answering,
    ModelUnavailable, QueueUnavailable when Redis cannot be reached, Http404 for another user's
    conversation. `only_if`: a condition the question's insert checks in the same statement
    (the sender's login session, SessionCheck.condition); QuestionNotStored when it fails.
    Before that insert only reads are made (and an ended answer stored, as the recorder would
    store it anyway), so a question with `only_if` cannot change the conversation's model."""
    user, conversation, text = question.user, question.conversation, question.text
    if conversation.owner_id != user.id:
        raise Http404
    if only_if is not None and (text is None or question.model is not None):
        raise ValueError("only_if guards a new question's insert, with the conversation's model")
    stored_ended = ensure_conversation_free(conversation=conversation)
    prompt, retrieved, asked, user_message = _question_and_prompt(question, only_if=only_if)
    item = WorkItem(
        id=question.request_id,
        user_id=str(user.id),
        conversation_id=str(conversation.id),
        messages=prompt.messages,
        max_tokens=prompt.max_tokens,
        temperature=settings.MODEL_TEMPERATURE,
        prompt_tokens_estimate=prompt.prompt_tokens_estimate,
        kind=web_kind(requested="chat", passages=len(retrieved.passages)),
        model=conversation.model,
    )

    def tell_tabs(pipe) -> None:
        if stored_ended:  # so the recorder does not insert it again
            transitions.answer_stored(pipe, keys(), stored_ended)
        tab_sync.question_event(
            pipe,
            conversation=conversation,
            message=user_message,
            request_id=item.id,
            replaces=question.replaces,
            new=question.new,
        )

    # Published after the question is committed, so a worker never answers a question that was
    # rolled back; if Redis is down the question is taken back, so nothing half-sent remains.
    try:
        first_event = request_publish(
            item=item,
            also=tell_tabs,
            citations=citations_from(retrieved.passages, question=asked),
            notice=retrieved.notice,
            api_key=question.api_key,
        )
    except RedisError as exc:
        if user_message is not None:
            user_message.delete()
        raise QueueUnavailable from exc
    # After the person's request, so the summary it asks for queues behind it.
    background.summary_schedule(conversation=conversation, prompt=prompt)
    return Submitted(item.id, conversation.id, user_message, first_event, retrieved.notice)


def _question_and_prompt(question: Question, *, only_if):
    """request_submit's middle part: the model, the question stored, the retrieval and the
    prompt."""
    user, conversation, text = question.user, question.conversation, question.text
    if question.model is not None and question.model != conversation.model:
        services.conversation_set_model(conversation=conversation, model=question.model)
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
        asked = text if text is not None else last_question(conversation=conversation)
        retrieved = passages_for(user=user, question=asked)
        prompt = prompt_build(
            conversation=conversation, passages=passages_block(retrieved.passages)
        )
        if question.instruction:  # after the history, so the cached prefix of the turns holds
            prompt.messages.append({"role": "user", "content": question.instruction})
    except Exception:
        if user_message is not None:
            user_message.delete()
        raise
    return prompt, retrieved, asked, user_message


def last_question(*, conversation: Conversation) -> str:
    last = conversation.messages.filter(role=Message.Role.USER).order_by("-created", "-id").first()
    return last.text if last else ""


def passages_for(*, user: User, question: str) -> Retrieval:
    """Retrieved passages for the question; none, marked unavailable (the answer goes on
    without them, and the person is told), when retrieval fails, since a chat without sources
    beats no chat."""
    try:
        return retrieval_for_prompt(user=user, query=question)
    except RetrievalRefused as exc:  # RAG_EMBEDDING_UNAVAILABLE=refuse: nothing is sent
        raise QueueUnavailable(str(exc)) from exc
    except Exception:
        log.exception("retrieval failed; answering without passages")
        return Retrieval(unavailable=True)
