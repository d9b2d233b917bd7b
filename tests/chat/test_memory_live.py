"""The rolling summary through the real processes: a question in a long conversation is
answered by a worker running SmolLM2, then the summary it asked for runs as a background
request (after the person's, never before) and the dispatcher's recorder stores the model's
text as the conversation's summary, not as a message."""

from __future__ import annotations

import pytest

from apps.chat.models import ConversationSummary, Message
from apps.chat.prompt.prompting import prompt_build
from apps.chat.submission import Question, request_submit
from core.redis_client import get_redis, keys
from tests.chat.test_memory import long_chat
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_long_chat_gets_its_summary_from_the_model_after_the_persons_answer(
    user, short_answers, settings, start_worker, dispatcher
):
    settings.MODEL_CONTEXT_TOKENS = 900
    conversation = long_chat(user)
    conversation.messages.filter(text="What is my locker code?").delete()
    start_worker("memory-w1")
    submitted = request_submit(
        Question(user=user, conversation=conversation, text="What is my locker code?")
    )
    [own] = [
        fields["id"]
        for _, fields in get_redis().xrange(keys().admit)
        if fields.get("kind") == "background"
    ]

    summary = wait_until(
        lambda: ConversationSummary.objects.filter(conversation=conversation).first(),
        timeout=600,
        what="the summary written by the model",
    )
    assert summary.text.strip() and summary.model == "smollm2-135m-instruct"
    assert not Message.objects.filter(request_id=own).exists()  # not a chat message
    answer = Message.objects.get(request_id=submitted.request_id)  # the person's, stored
    person, background = (
        get_redis().hget(keys().request(r), "dispatched_ms") for r in (submitted.request_id, own)
    )
    assert int(person) <= int(background)  # the person's question went to the worker first
    prompt = prompt_build(conversation=conversation)
    assert summary.text.strip()[:40] in prompt.messages[0]["content"]
    assert answer.text in "\n".join(m["content"] for m in prompt.messages)
