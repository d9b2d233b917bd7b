"""Questions that change a conversation's shape: the first one, which creates the conversation
(so no empty "New chat" is ever stored), an edited one, and the requests that answer the
conversation as it stands: regenerate and continue. Each submits through
submission.request_submit.

Editing a sent question discards the old branch: the question and every message after it are
deleted, and the conversation continues from the edited text, as if it had been asked so the
first time. One linear history keeps prompts, memory and exports simple; the old text is
gone from the page, from later prompts and from the conversation's summary.

A new chat is named at once from its question; the model's own title follows (suggestions.py).

Continue: an answer cut short (the length cap, a cap while Sluice sheds load, or stopped
because it looped) goes on in a new request. The new request reads the conversation as it is,
ending with the cut answer, plus one instruction for this request only: carry on from where the
answer stopped. The continuation is stored as an answer of its own, right after the one it
continues (the page shows it as the next bubble). The instruction comes after the history, so a
worker that still holds the conversation's KV cache reads only the instruction.
"""

from __future__ import annotations

import logging
import re

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.http import Http404
from redis.exceptions import RedisError

from apps.accounts.models import User
from apps.chat import background, services, suggestions
from apps.chat.models import Conversation, Message
from apps.chat.prompt import memory_summary
from apps.chat.submission import (
    ConversationBusy,
    Question,
    Submitted,
    answers_dropped,
    ensure_conversation_free,
    request_submit,
)

log = logging.getLogger("sluice.chat.turns")

TITLE_MAX = 60


def title_from_question(text: str) -> str:
    """A short title from the first question: its first line, cut at a word before
    TITLE_MAX characters, without a trailing question mark or colon."""
    first = next((line for line in text.splitlines() if line.strip()), text)
    title = " ".join(first.split())
    title = re.sub(r"^(please|hi|hello|hey)[,!.]?\s+", "", title, flags=re.IGNORECASE) or title
    if len(title) > TITLE_MAX:
        cut = title[:TITLE_MAX].rsplit(" ", 1)[0] or title[:TITLE_MAX]
        title = cut.rstrip(",;:-") + "…"
    title = title.rstrip("?:").strip() or services.UNTITLED
    return title[0].upper() + title[1:]


def conversation_start(*, user: User, text: str) -> Submitted:
    """A new conversation with its first question, answered. Nothing is kept when the question
    is refused (ValidationError, QueueUnavailable): the conversation goes with it."""
    services.clean_message_text(text)  # refused before anything is stored
    conversation = services.conversation_create(owner=user, title=title_from_question(text))
    try:
        submitted = request_submit(
            Question(user=user, conversation=conversation, text=text, new=True)
        )
    except Exception:
        conversation.delete()
        raise
    if settings.SLUICE_TITLES:
        title_schedule(conversation=conversation, question=text)
    return submitted


def title_schedule(*, conversation: Conversation, question: str) -> str | None:
    """Asks the model for the new chat's title (served after people's questions). Never
    raises: the chat keeps the name from its question."""
    try:
        return background.background_submit(
            user_id=conversation.owner_id,
            purpose=suggestions.title_purpose(conversation=conversation),
            messages=suggestions.title_messages(question=question),
            max_tokens=suggestions.TITLE_MAX_TOKENS,
            model=conversation.model,
        )
    except RedisError:
        log.warning("title of conversation %s not asked: Redis unreachable", conversation.id)
        return None


def message_edit(
    *, user: User, conversation: Conversation, message_id: int, text: str, request_id: str = ""
) -> tuple[Submitted, int]:
    """Replaces a sent question and what followed it with `text`, and answers it. Returns the
    submission and the id of the first message removed. Http404 for a message that is not a
    question of this conversation. `request_id`: see _with_id."""
    if conversation.owner_id != user.id:
        raise Http404
    services.clean_message_text(text)
    ensure_conversation_free(conversation=conversation)
    try:
        edited = conversation.messages.get(id=message_id, role=Message.Role.USER)
    except (Message.DoesNotExist, ValueError, TypeError):
        raise Http404("That message was not found.") from None
    dropped = conversation.messages.filter(
        Q(created__gt=edited.created) | Q(created=edited.created, id__gte=edited.id)
    )
    answers_dropped([r for r in dropped.values_list("request_id", flat=True) if r])
    with transaction.atomic():
        # A summary that covers the discarded turns speaks for them no more (memory.py
        # asks for a new one when the conversation grows long again).
        memory_summary.summary_discard_from(conversation_id=conversation.id, message_id=edited.id)
        dropped.delete()
    question = Question(user=user, conversation=conversation, text=text, replaces=edited.id)
    return request_submit(_with_id(question, request_id)), edited.id


def _with_id(question: Question, request_id: str) -> Question:
    """`request_id`: the answer's id when the caller follows it before it exists (a websocket:
    its own event to the user's tabs is then known as its own); "" for a new one."""
    if request_id:
        question.request_id = request_id
    return question


CONTINUE_INSTRUCTION = (
    "Your previous answer was cut off. Continue it from exactly where it stopped, without "
    "repeating what you already wrote and without starting over."
)


def answer_continue(*, user: User, conversation: Conversation, request_id: str = "") -> Submitted:
    """A new request that continues the conversation's last answer. Raises ConversationBusy
    when an answer is still generating or there is no answer to continue."""
    ensure_conversation_free(conversation=conversation)
    last = conversation.messages.order_by("-created", "-id").first()
    if last is None or last.role != Message.Role.ASSISTANT or not last.text.strip():
        raise ConversationBusy("There is no answer to continue.")
    if last.status != Message.Status.DONE:  # only finished turns are in the prompt's history
        raise ConversationBusy("Only an answer that ended can be continued; regenerate it.")
    question = Question(user=user, conversation=conversation, instruction=CONTINUE_INSTRUCTION)
    return request_submit(_with_id(question, request_id))


def answer_regenerate(*, user: User, conversation: Conversation, request_id: str = "") -> Submitted:
    """Drops the last answer and asks again from the same history."""
    ensure_conversation_free(conversation=conversation)
    last = conversation.messages.order_by("-created", "-id").first()
    if last is None:
        raise ConversationBusy("There is nothing to regenerate yet.")
    if last.role == Message.Role.ASSISTANT:
        answers_dropped([last.request_id] if last.request_id else [])
        last.delete()
    return request_submit(_with_id(Question(user=user, conversation=conversation), request_id))
