""" "Your answer is ready": an inbox message for each answer that took long, posted after the
recorder stored it, so a person who left the page learns that it is there."""

from __future__ import annotations

import logging

from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from apps.chat.models import Conversation
from apps.inbox.models import InboxMessage
from apps.inbox.services import inbox_post
from worker.protocol import State

log = logging.getLogger("sluice.chat.answer_ready")
Kind = InboxMessage.Kind


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
            kind=Kind.ANSWER_READY,
            text=f"Your answer in “{title}” is ready.",
            data={
                "conversation_id": conversation_id,
                "request_id": answer.id,
                "url": reverse("chat:conversation", args=[conversation_id]),
            },
        )
