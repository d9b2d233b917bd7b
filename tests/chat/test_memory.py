"""Conversation memory: the summary stands in for dropped turns, pinned and key-fact turns stay
in the prompt, and the summary is asked for as a background request whose answer goes to the
summary (not into the conversation)."""

from __future__ import annotations

import datetime
import itertools

import pytest
from django.utils import timezone

from apps.chat import background
from apps.chat.models import ConversationSummary, Message
from apps.chat.prompt import memory_summary
from apps.chat.prompt.prompting import prompt_build
from apps.chat.recorder import ensure_group, record_pending
from apps.chat.services import conversation_create, message_create
from apps.chat.submission import Question, request_submit
from contract.protocol import Answer, State, WorkItem
from core.redis_client import get_redis, keys

pytestmark = pytest.mark.django_db


@pytest.fixture
def small_window(settings):
    # Room for about a dozen of the turns below: a 30-exchange chat overflows it.
    settings.MODEL_CONTEXT_TOKENS, settings.MODEL_MAX_TOKENS = 900, 100


def long_chat(user, *, exchanges: int = 30):
    conversation = conversation_create(owner=user)
    message_create(
        conversation=conversation,
        role="user",
        text="My name is Oriel and my locker code is 4471. What is a sluice?",
    )
    message_create(
        conversation=conversation,
        role="assistant",
        request_id="a0",
        text="Hello Oriel. A sluice is a water channel controlled by a gate.",
    )
    for n in range(1, exchanges):
        message_create(
            conversation=conversation,
            role="user",
            text=f"Tell me about river number {n} and how its banks are shaped.",
        )
        message_create(
            conversation=conversation,
            role="assistant",
            request_id=f"a{n}",
            text=f"River {n} runs past farms and mills; its banks are " + "mud " * 20,
        )
    message_create(conversation=conversation, role="user", text="What is my locker code?")
    return conversation


def prompt_text(prompt) -> str:
    return "\n".join(m["content"] for m in prompt.messages)


def admitted(kind: str) -> list[WorkItem]:
    entries = get_redis().xrange(keys().admit)
    return [item for _, f in entries if (item := WorkItem.from_fields(f)).kind == kind]


def test_a_long_chat_keeps_stated_facts_and_asks_for_a_summary_of_what_falls_out(
    user, small_window
):
    conversation = long_chat(user)
    prompt = prompt_build(conversation=conversation)
    text = prompt_text(prompt)
    assert "river number 1 " not in text  # the oldest turns fell out of the window...
    assert "locker code is 4471" in text  # ...but the fact the user stated stays
    assert prompt.messages[-1]["content"] == "What is my locker code?"
    assert prompt.prompt_tokens_estimate <= 900 - 100
    due = [t.id for t in prompt.to_summarise]
    assert due and due == sorted(due)  # the oldest turns, in order
    assert due[0] == conversation.messages.order_by("id").first().id


def test_the_summary_replaces_the_turns_it_covers(user, small_window):
    conversation = long_chat(user)
    turns = list(conversation.messages.order_by("id"))
    covered = turns[39]  # the summary speaks for the first 40 messages
    memory_summary.summary_store(
        conversation_id=conversation.id,
        upto_message_id=covered.id,
        text="- The user is Oriel.\n- Rivers 1 to 19 were discussed.",
    )
    prompt = prompt_build(conversation=conversation)
    system, recent = prompt.messages[0]["content"], prompt.messages[1:]
    assert "What you remember of this conversation so far:" in system
    assert "Rivers 1 to 19 were discussed." in system
    covered_texts = {t.text for t in turns[:40]}
    assert not [m for m in recent if m["content"] in covered_texts]  # no covered turn raw
    assert recent[-1]["content"] == "What is my locker code?"
    assert prompt.prompt_tokens_estimate <= 900 - 100
    # The next summary starts where this one ends: incremental, never the whole history.
    assert all(t.id > covered.id for t in prompt.to_summarise)


def test_a_pinned_answer_stays_in_the_prompt(user, small_window, client_for):
    conversation = long_chat(user)
    old_answer = conversation.messages.get(request_id="a2")
    assert old_answer.text not in prompt_text(prompt_build(conversation=conversation))
    url = f"/c/{conversation.id}/messages/{old_answer.id}/pin/"
    response = client_for(user).post(url, {"pinned": "1"}, HTTP_ACCEPT="application/json")
    assert response.json() == {"id": old_answer.id, "pinned": True}
    text = prompt_text(prompt_build(conversation=conversation))
    assert "Assistant (pinned): River 2 runs past farms" in text
    client_for(user).post(url, {"pinned": "0"})
    assert "(pinned)" not in prompt_text(prompt_build(conversation=conversation))


def test_nobody_pins_another_users_message(user, other_user, client_for):
    conversation = conversation_create(owner=user)
    message = message_create(conversation=conversation, role="user", text="Mine.")
    url = f"/c/{conversation.id}/messages/{message.id}/pin/"
    assert client_for(other_user).post(url, {"pinned": "1"}).status_code == 404
    assert client_for(user).post(url, {"pinned": "yes"}).status_code == 400
    message.refresh_from_db()
    assert not message.pinned


def record_answer(request_id: str, user_id: int, text: str, *, worker_id: str = "w1") -> None:
    get_redis().xadd(
        keys().done,
        Answer(
            id=request_id,
            user_id=str(user_id),
            conversation_id="",
            state=State.DONE,
            text=text,
            worker_id=worker_id,
        ).to_fields(),
    )
    record()


def record() -> None:
    ensure_group()
    record_pending(consumer="test", block_ms=None)


def test_sending_a_question_asks_for_the_summary_and_its_answer_becomes_the_summary(
    user, small_window, settings
):
    settings.SLUICE_ADMISSION = True
    conversation = long_chat(user)
    conversation.messages.filter(text="What is my locker code?").delete()
    request_submit(Question(user=user, conversation=conversation, text="What is my locker code?"))
    request_submit_again = admitted("background")
    assert len(request_submit_again) == 1
    item = request_submit_again[0]
    assert item.purpose["task"] == "summary" and item.conversation_id == ""
    assert "locker code is 4471" in item.messages[-1]["content"]  # the dropped turns it folds
    # The person's request holds the conversation; the background one never does.
    assert get_redis().get(keys().conversation_active(conversation.id)) != item.id

    messages_before = conversation.messages.count()
    record_answer(item.id, user.id, "- The user asked about a sluice and rivers 1 to 3.")
    summary = ConversationSummary.objects.get(conversation=conversation)
    assert summary.text == "The user asked about a sluice and rivers 1 to 3."
    assert summary.upto_message_id == item.purpose["upto"]
    assert conversation.messages.count() == messages_before  # no chat message from it
    system = prompt_build(conversation=conversation).messages[0]["content"]
    assert "The user asked about a sluice and rivers 1 to 3." in system
    # What the user said of themselves outlives the turns the summary folded, word for word.
    assert '"My name is Oriel and my locker code is 4471."' in system

    # The same answer delivered again changes nothing; a new question asks for the next part.
    record_answer(item.id, user.id, "- something else")
    summary.refresh_from_db()
    assert summary.text == "The user asked about a sluice and rivers 1 to 3."


def test_only_one_summary_is_in_flight_per_conversation(user, small_window, settings):
    settings.SLUICE_ADMISSION = True
    conversation = long_chat(user)
    prompt = prompt_build(conversation=conversation)
    first = background.summary_schedule(conversation=conversation, prompt=prompt)
    assert first is not None
    assert background.summary_schedule(conversation=conversation, prompt=prompt) is None
    record_answer(first, user.id, "- The user is Oriel.")
    # Stored, the summary is where the next one starts: only turns after it are due.
    later = prompt_build(conversation=conversation)
    assert (
        later.summary == "The user is Oriel." and later.summary_upto == prompt.to_summarise[-1].id
    )
    assert all(t.id > later.summary_upto for t in later.to_summarise)


def test_a_short_chat_is_sent_whole_and_asks_for_no_summary(user):
    conversation = conversation_create(owner=user)
    message_create(conversation=conversation, role="user", text="Hi, I'm Ada.")
    prompt = prompt_build(conversation=conversation)
    assert prompt.messages[1:] == [{"role": "user", "content": "Hi, I'm Ada."}]
    assert prompt.to_summarise == []


def test_a_failed_summary_frees_the_conversation_for_the_next_try(user, small_window, settings):
    settings.SLUICE_ADMISSION = True
    conversation = long_chat(user)
    prompt = prompt_build(conversation=conversation)
    first = background.summary_schedule(conversation=conversation, prompt=prompt)
    get_redis().xadd(
        keys().done,
        Answer(
            id=first, user_id=str(user.id), conversation_id="", state=State.FAILED, error="shed"
        ).to_fields(),
    )
    record()
    assert not ConversationSummary.objects.filter(conversation=conversation).exists()
    assert background.summary_schedule(conversation=conversation, prompt=prompt) is not None
    assert Message.objects.filter(request_id=first).count() == 0


def test_the_page_shows_what_sluice_remembers(user, client_for, small_window):
    conversation = long_chat(user, exchanges=3)
    page = client_for(user).get(f"/c/{conversation.id}/").content.decode()
    assert "What I remember" not in page  # it all fits: the prompt holds it as it was said
    assert 'class="link pin-button" aria-pressed="false">Pin<' in page
    conversation = long_chat(user)
    last = conversation.messages.order_by("id").last()
    memory_summary.summary_store(
        conversation_id=conversation.id,
        upto_message_id=last.id - 2,
        text="The user <b>asked</b> about river number 3.",
    )
    page = client_for(user).get(f"/c/{conversation.id}/").content.decode()
    assert "What I remember" in page
    assert "The user &lt;b&gt;asked&lt;/b&gt; about river number 3." in page  # text
    # An entry, in the user's words, with its edit form.
    assert "&quot;My name is Oriel and my locker code is 4471.&quot;" in page
    assert 'name="key" value="said:' in page


def chat_with_an_answer_stored_after_the_next_question(user, *, late: int = 10):
    """30 exchanges where answer `late` was stored in one statement with question `late + 1`
    and got the higher id of the two, though it comes first (created a microsecond before)."""
    conversation = conversation_create(owner=user)
    said = []  # in the conversation's order
    for n in range(30):
        question = message_create(
            conversation=conversation,
            role="user",
            text=f"Tell me about river number {n} and how its banks are shaped.",
        )
        answer = f"River {n} runs past farms and mills; its banks are " + "mud " * 20
        if n == late + 1:
            stored = message_create(
                conversation=conversation, role="assistant", request_id=f"a{late}", text=answer
            )
            said.append(stored)
        said.append(question)
        if n != late:
            said.append(
                message_create(
                    conversation=conversation,
                    role="assistant",
                    request_id=f"a{n}",
                    text=answer,
                )
            )
    said.append(
        message_create(conversation=conversation, role="user", text="What is my locker code?")
    )
    # One test transaction gives every message the same now(): the order is set here.
    start = timezone.now()
    for index, message in enumerate(said):
        created = start + datetime.timedelta(seconds=index)
        if message.request_id == f"a{late}":
            created = start + datetime.timedelta(seconds=index + 1, microseconds=-1)
        Message.objects.filter(id=message.id).update(created=created)
    return conversation


def test_the_summary_covers_turns_in_the_conversations_order_not_by_id(user, small_window):
    conversation = chat_with_an_answer_stored_after_the_next_question(user)
    late_answer = conversation.messages.get(request_id="a10")
    next_question = conversation.messages.get(text__startswith="Tell me about river number 11 ")
    assert late_answer.id > next_question.id and late_answer.created < next_question.created
    memory_summary.summary_store(
        conversation_id=conversation.id, upto_message_id=late_answer.id, text="- Rivers 0 to 10."
    )
    prompt = prompt_build(conversation=conversation)
    # The question after the summary's last turn is not covered by it: it is due next.
    assert prompt.to_summarise[0].id == next_question.id
    roles = [m["role"] for m in prompt.messages[1:]]
    assert all(a != b for a, b in itertools.pairwise(roles))  # turns alternate
    # A summary that goes on from there moves memory forward, whatever the ids say.
    stored = memory_summary.summary_store(
        conversation_id=conversation.id,
        upto_message_id=next_question.id,
        text="- Rivers 0 to 11.",
        covered_from=late_answer.id,
    )
    assert stored is not None and stored.text == "- Rivers 0 to 11."


def test_a_summary_cut_by_its_length_cap_keeps_only_complete_notes(user, small_window, settings):
    settings.SLUICE_ADMISSION = True
    conversation = long_chat(user)
    prompt = prompt_build(conversation=conversation)
    request_id = background.summary_schedule(conversation=conversation, prompt=prompt)
    get_redis().xadd(
        keys().done,
        Answer(
            id=request_id,
            user_id=str(user.id),
            conversation_id="",
            state=State.DONE,
            text="- The user is Oriel.\n- Locker code 4471.\n- Asked about rivers and how th",
            finish_reason="length",
        ).to_fields(),
    )
    record()
    summary = ConversationSummary.objects.get(conversation=conversation)
    assert summary.text == "The user is Oriel.\nLocker code 4471."


def test_a_summary_waiting_in_line_marks_its_conversation_and_a_dropped_one_frees_it(
    user, small_window, settings
):
    settings.SLUICE_ADMISSION = True
    conversation = long_chat(user)
    prompt = prompt_build(conversation=conversation)
    assert not background.summary_pending(conversation_id=conversation.id)
    request_id = background.summary_schedule(conversation=conversation, prompt=prompt)
    assert background.summary_pending(conversation_id=conversation.id)
    [item] = admitted("background")
    assert item.purpose["wait_s"] == background.SUMMARY_WAIT_SECONDS
    dropped = Answer(id=request_id, user_id=str(user.id), conversation_id="", state=State.CANCELLED)
    dropped.code = "dropped"  # its wait in line ran out while the service was degraded
    get_redis().xadd(keys().done, dropped.to_fields())
    record()
    assert not background.summary_pending(conversation_id=conversation.id)
    assert background.summary_schedule(conversation=conversation, prompt=prompt) is not None
