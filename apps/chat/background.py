"""Background requests: work Sluice starts itself, through the same admission and fair queue as
a person's question, as kind `background` (the dispatcher serves them last, keeps them in
line while the service degrades, and drops one quietly when its `wait_s` runs out).

A background answer is not a chat message. Its work item carries a *purpose* ({"task": ...,
with what the task needs}), written into the request's hash too; the answer recorder reads it
back and hands the finished answer to the task's handler here instead of storing a message.
The requests name no conversation (the purpose does), so one never holds a conversation's
"answering" slot and a person's next question is never refused because of it.

Tasks: `summary` (fold turns that are falling out of the prompt into the conversation's
rolling summary; the conversation is "summary pending" while it waits, `summary_pending`),
`followups` (up to three suggested questions after an answer, posted to the
user's inbox), `tags` (profile tags proposed from the user's questions, applied only when
the user accepts them) and `memory` (the user's words a model that writes memory keeps of each
turn, memory_writer.py; only for models the operator lets write it).

And "your answer is ready": an inbox message for each answer that took long, posted after the
recorder stored it, so a person who left the page learns that it is there.
"""

from __future__ import annotations

import json
import logging

from django.conf import settings
from django.urls import reverse
from django.utils import timezone
from redis.exceptions import RedisError

from apps.chat import suggestions
from apps.chat.models import Conversation
from apps.chat.prompt import memory, memory_summary, memory_writer
from apps.chat.prompt.prompting import Prompt
from apps.chat.publish import request_publish
from apps.inbox import services as inbox
from apps.inbox.models import InboxMessage
from apps.inbox.services import inbox_post
from contract import protocol
from contract.protocol import Answer, State, WorkItem
from core.redis_client import get_redis, keys

log = logging.getLogger("sluice.chat.background")

KIND = "background"
# How long each task may wait in line (the purpose's `wait_s`, which the dispatcher reads):
# while the service degrades, background work waits instead of being refused, and runs when
# the line is quiet again; one still waiting then is dropped quietly, without an error. A
# summary keeps its conversation's memory whole, so it waits longest; suggestions and a title
# are worth little once the person has moved on.
SUMMARY_WAIT_SECONDS = 1800
MEMORY_WAIT_SECONDS = SUMMARY_WAIT_SECONDS  # as long: a turn not noted is read by the rules
FOLLOWUPS_WAIT_SECONDS = 180
TAGS_WAIT_SECONDS = 600
# How long a task is taken to be in flight (one per conversation or user): its wait in line
# and a run after it, so a lost one is asked again but a waiting one is not asked twice.
IN_FLIGHT_SECONDS = SUMMARY_WAIT_SECONDS + 600


class Task:
    SUMMARY = "summary"
    FOLLOWUPS = "followups"
    TAGS = "tags"
    MEMORY = "memory"


def background_submit(
    *,
    user_id: int,
    purpose: dict,
    messages: list[dict[str, str]],
    max_tokens: int,
    model: str = "",
    response_format: dict | None = None,
) -> str:
    """Hands a background request to admission; returns its id. Raises RedisError.
    `response_format`: OpenAI's, for an answer the engine holds to a JSON schema."""
    item = WorkItem(
        id=protocol.new_request_id(),
        user_id=str(user_id),
        conversation_id="",
        messages=messages,
        max_tokens=max_tokens,
        temperature=0.0,
        prompt_tokens_estimate=sum(memory.estimate_tokens(m["content"]) for m in messages),
        kind=KIND,
        model=model,
        purpose=purpose,
        response_format=response_format or {},
    )
    request_publish(item=item)
    log.info(
        "background request %s submitted: %s for user %s", item.id, purpose.get("task"), user_id
    )
    return item.id


def _in_flight_key(task: str, owner: int) -> str:
    return keys().background_in_flight(task, owner)


def _claim(task: str, owner: int) -> bool:
    """One task of a kind in flight per conversation (or user): True if this caller got it."""
    return bool(get_redis().set(_in_flight_key(task, owner), "1", nx=True, ex=IN_FLIGHT_SECONDS))


def _release(task: str, owner: int) -> None:
    get_redis().delete(_in_flight_key(task, owner))


def summary_pending(*, conversation_id: int) -> bool:
    """Whether a summary of the conversation is asked and not yet written: it may be waiting
    for a quiet line while the service degrades. Until it is, the prompt keeps the user's
    stated facts from the turns it will fold in."""
    return bool(get_redis().exists(_in_flight_key(Task.SUMMARY, conversation_id)))


# -- asking -----------------------------------------------------------------------------------


def summary_schedule(*, conversation: Conversation, prompt: Prompt) -> str | None:
    """Asks for the summary the prompt found due (turns falling out of the window), unless one
    is already on its way for this conversation. Never raises: the person's question is sent
    already, and the next one asks again."""
    if not prompt.to_summarise or not settings.SLUICE_SUMMARIES:
        return None
    try:
        if not _claim(Task.SUMMARY, conversation.id):
            return None
        purpose = {
            "task": Task.SUMMARY,
            "conversation": conversation.id,
            "upto": prompt.to_summarise[-1].id,
            "from": prompt.summary_upto,
            "previous": prompt.summary,
            "wait_s": SUMMARY_WAIT_SECONDS,
        }
        messages = memory_summary.summary_messages(
            previous=prompt.summary, turns=prompt.to_summarise
        )
        return background_submit(
            user_id=conversation.owner_id,
            purpose=purpose,
            messages=messages,
            max_tokens=memory_summary.SUMMARY_MAX_TOKENS,
            model=conversation.model,
        )
    except RedisError:
        log.warning("summary of conversation %s not asked: Redis unreachable", conversation.id)
        return None


def answers_recorded(answers: list[Answer], *, requests: list[dict]) -> None:
    """After the recorder's batch: background answers to their handlers; for each finished chat
    answer, follow-up questions and (every so many questions) tag proposals. `requests`: each
    answer's request fields, as the recorder read them (its "purpose"). Never raises."""
    for answer, fields in zip(answers, requests, strict=True):
        purpose = _purpose(fields.get("purpose"))
        try:
            if purpose:
                _finished(answer, purpose)
            elif answer.conversation_id and answer.state == State.DONE:
                _after_answer(answer)
        except Exception:
            log.exception("background handling of %s failed", answer.id)


def _purpose(raw: str | None) -> dict:
    try:
        purpose = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return purpose if isinstance(purpose, dict) else {}


def _after_answer(answer: Answer) -> None:
    user_id, conversation_id = int(answer.user_id), int(answer.conversation_id)
    followups = settings.SLUICE_FOLLOWUPS and answer.text.strip()
    every = settings.SLUICE_TAG_PROPOSAL_EVERY
    if not followups and every <= 0 and not memory_writer.any_writes_memory():
        return  # nothing to ask: the conversation is not read
    model = Conversation.objects.filter(id=conversation_id).values_list("model", flat=True)
    model = model.first() or ""
    try:  # memory is asked apart: a failure here must not cost the follow-ups
        if memory_writer.writes_memory(model):
            memory_schedule(answer=answer, model=model)
    except Exception:
        log.exception("memory of %s not asked", answer.id)
    if not followups and every <= 0:
        return
    if followups:
        question = suggestions.followups_question_for(conversation_id=conversation_id)
        background_submit(
            user_id=user_id,
            model=model,
            purpose={
                "task": Task.FOLLOWUPS,
                "conversation": conversation_id,
                "request": answer.id,
                "question": question[:600],
                "wait_s": FOLLOWUPS_WAIT_SECONDS,
            },
            messages=suggestions.followups_messages(question=question),
            max_tokens=suggestions.FOLLOWUPS_MAX_TOKENS,
        )
    if every > 0 and suggestions.questions_asked(user_id=user_id) % every == 0:
        tags_schedule(user_id=user_id, model=model)


def memory_schedule(*, answer: Answer, model: str) -> str | None:
    """Asks the model which of the user's words in the turn this answer answers to keep
    (memory_writer.py), once per turn."""
    conversation_id = int(answer.conversation_id)
    turn = memory_writer.turn_to_note(conversation_id=conversation_id, request_id=answer.id)
    if turn is None or not _claim(Task.MEMORY, turn[0]):
        return None
    said, before = memory_writer.texts_of(message_id=turn[0], previous_id=turn[1]) or ("", "")
    return background_submit(
        user_id=int(answer.user_id),
        model=model,
        purpose={
            "task": Task.MEMORY,
            "conversation": conversation_id,
            "message": turn[0],
            "before": turn[1],
            "wait_s": MEMORY_WAIT_SECONDS,
        },
        messages=memory_writer.writer_messages(user_text=said, assistant_text=before),
        max_tokens=memory_writer.WRITER_MAX_TOKENS,
        response_format=memory_writer.RESPONSE_FORMAT,
    )


def tags_schedule(*, user_id: int, model: str = "") -> str | None:
    """Asks which of the admin's tags fit the user's recent questions (tags the user has, or
    was proposed before, are left out); None when there is nothing to ask."""
    tags = suggestions.tags_open_for(user_id=user_id)
    messages = suggestions.tags_messages(user_id=user_id, tags=tags)
    if messages is None or not _claim(Task.TAGS, user_id):
        return None
    return background_submit(
        user_id=user_id,
        model=model,
        messages=messages,
        purpose={"task": Task.TAGS, "tags": [t.id for t in tags], "wait_s": TAGS_WAIT_SECONDS},
        max_tokens=suggestions.TAGS_MAX_TOKENS,
    )


# -- answers ----------------------------------------------------------------------------------


def _finished(answer: Answer, purpose: dict) -> None:
    task = purpose.get("task")
    done = answer.state == State.DONE
    if answer.code == "dropped":  # its wait in line ran out: nobody waited for it
        log.info("background %s %s dropped: it waited its time in line", task, answer.id)
    elif not done:
        log.info("background %s %s ended %s: %s", task, answer.id, answer.state, answer.error)
    if task == Task.SUMMARY:
        conversation_id = int(purpose["conversation"])
        if done:
            stored = memory_summary.summary_written(
                conversation_id=conversation_id,
                upto_message_id=int(purpose["upto"]),
                covered_from=int(purpose["from"]),
                previous=purpose.get("previous", ""),
                answer=answer.text,
                finish_reason=answer.finish_reason,
                model=_model_of(answer),
            )
            log.info(
                "summary of conversation %s %s",
                conversation_id,
                "stored" if stored else "not needed any more",
            )
        _release(Task.SUMMARY, conversation_id)
    elif task == Task.FOLLOWUPS and done:
        questions = suggestions.followups_parse(answer.text, question=purpose.get("question", ""))
        conversation_id = int(purpose["conversation"])
        if questions and suggestions.conversation_exists(conversation_id):
            inbox.inbox_post(
                user_id=int(answer.user_id),
                kind=InboxMessage.Kind.FOLLOWUPS,
                text="Suggested follow-up questions",
                data={
                    "conversation_id": conversation_id,
                    "request_id": purpose.get("request", ""),
                    "message_id": suggestions.answer_message_id(
                        request_id=purpose.get("request", "")
                    ),
                    "questions": questions,
                },
            )
    elif task == Task.MEMORY:
        if done:
            memory_writer.noted_keep(
                answer.text,
                conversation_id=int(purpose["conversation"]),
                message_id=int(purpose["message"]),
                previous_id=int(purpose["before"]),
            )
        _release(Task.MEMORY, int(purpose["message"]))
    elif task == suggestions.TITLE_TASK and done:
        suggestions.title_finished(purpose=purpose, answer_text=answer.text)
    elif task == Task.TAGS:
        if done:
            tags = suggestions.tags_open_for(user_id=int(answer.user_id))
            allowed = [t for t in tags if t.id in set(purpose.get("tags") or [])]
            named = suggestions.tags_parse(answer.text, tags=allowed)
            suggestions.tags_propose(user_id=int(answer.user_id), tag_ids=[t.id for t in named])
        _release(Task.TAGS, int(answer.user_id))


def _model_of(answer: Answer) -> str:
    """The model that wrote the answer, as its worker announces it (its id when unknown)."""
    try:
        beat = json.loads(get_redis().get(keys().heartbeat(answer.worker_id)) or "{}")
    except (RedisError, ValueError):
        beat = {}
    model = beat.get("model") if isinstance(beat, dict) else ""
    return (model or answer.worker_id)[:200]


# -- "your answer is ready" --------------------------------------------------------------------


def answers_ready_post(answers: list, *, requests: list[dict]) -> None:
    """After the recorder stored a batch: an inbox message for each answer that took long
    (ANSWER_READY_SECONDS from question to end, or a `long` request). The page shows it only
    when its user is not looking at that conversation. `requests`: each answer's request
    fields, as the recorder read them ("created_ms", "kind"). Never raises: the recorder goes
    on."""
    try:
        _answers_ready_post(answers, requests)
    except Exception:
        log.exception("answer-ready messages not posted")


def _answers_ready_post(answers: list, requests: list[dict]) -> None:
    done = [
        (a, fields)
        for a, fields in zip(answers, requests, strict=True)
        if a.conversation_id and a.state == State.DONE
    ]
    if not done:
        return
    now_ms = timezone.now().timestamp() * 1000
    slow = []
    for answer, fields in done:
        created_ms, kind = fields.get("created_ms"), fields.get("kind")
        took = (now_ms - int(created_ms)) / 1000 if created_ms else 0.0
        if kind == "background":
            continue  # work Sluice started itself: nobody waits for it
        if kind == "long" or took >= settings.INBOX_ANSWER_READY_SECONDS:
            slow.append(answer)
    if not slow:
        return
    titles = dict(
        Conversation.objects.filter(id__in=[int(a.conversation_id) for a in slow]).values_list(
            "id", "title"
        )
    )
    for answer in slow:
        conversation_id = int(answer.conversation_id)
        if conversation_id not in titles:
            continue  # deleted meanwhile
        title = titles[conversation_id]
        inbox_post(
            user_id=int(answer.user_id),
            kind=InboxMessage.Kind.ANSWER_READY,
            text=f"Your answer in “{title}” is ready.",
            data={
                "conversation_id": conversation_id,
                "request_id": answer.id,
                "url": reverse("chat:conversation", args=[conversation_id]),
            },
        )
