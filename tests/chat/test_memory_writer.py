"""Memory a model writes (memory_writer.py): its answer only points at the user's words (a quote
not in the turn is dropped, a chosen option must be in the assistant's answer); what it noted
of a turn stands in for the model-free reading of that turn, a turn it has not noted is read as
before, and a newer noted statement on the same subject shows the older as earlier. A summary
folds noted turns in and keeps what waits. On the real stack, a model the operator lets write
memory gets a background `memory` request after an answer, held to the JSON schema by the
engine, and what it noted is kept."""

from __future__ import annotations

import json

import httpx
import pytest

from apps.accounts.services import api_key_create
from apps.chat.models import ConversationSummary, MemoryWriter, Message
from apps.chat.prompt import memory_facts, memory_summary, memory_writer
from apps.chat.prompt.memory_facts import NOTED
from apps.chat.prompt.prompting import prompt_build
from apps.chat.services import conversation_create, message_create
from tests.chat.test_background_live import ask, background_requests
from tests.chat.test_memory_truth import ANSWER, FILLER
from tests.chat.test_openai_api import roomy
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db

OPTIONS = "Two good ones: 1. Hotel Miramar, by the beach. 2. Casa Azul, in the old town."


def answer(facts: list[str], chosen: str = "") -> str:
    return json.dumps({"facts": [{"quote": q} for q in facts], "chosen": chosen})


def test_quotes_not_in_the_turn_are_dropped_and_found_ones_kept_as_the_user_wrote_them():
    said = "Hi! I moved to   Lyon in May, and my sister\u2019s name is Ana."
    noted = memory_writer.noted_from_answer(
        answer(["i moved to Lyon in may", "my sister's name is Ana", "The user is a baker."]),
        user_text=said,
        assistant_text="",
        at=7,
    )
    assert [e.value for e in noted] == ["I moved to   Lyon in May", "my sister\u2019s name is Ana"]
    assert {e.kind for e in noted} == {NOTED} and {e.at for e in noted} == {7}


def test_a_chosen_option_must_be_named_in_the_assistants_answer():
    noted = memory_writer.noted_from_answer(
        answer([], chosen="casa azul"), user_text="That one, please.", assistant_text=OPTIONS, at=3
    )
    assert [(e.value, e.context) for e in noted] == [("That one, please.", "Casa Azul")]
    invented = memory_writer.noted_from_answer(
        answer([], chosen="Grand Hotel"), user_text="That one.", assistant_text=OPTIONS, at=3
    )
    assert [e.value for e in invented] == [""]  # nothing noted: an empty mark


def test_an_answer_that_is_not_the_json_asked_for_leaves_the_turn_to_the_rules():
    for text in ("I moved to Lyon", '{"facts": "Lyon"}', "[]"):
        assert memory_writer.noted_from_answer(text, user_text="x", assistant_text="", at=1) is None


def chat(user, lines: list[str]):
    """The user's lines, each answered, then exchanges that push them out of the window."""
    conversation = conversation_create(owner=user)
    ids = []
    for n, text in enumerate([*lines, *(FILLER.format(n=n) for n in range(24))]):
        message = message_create(conversation=conversation, role="user", text=text)
        ids.append(message.id)
        message_create(
            conversation=conversation, role="assistant", request_id=f"w{n}", text=ANSWER.format(n=n)
        )
    message_create(conversation=conversation, role="user", text="What do you know about me?")
    return conversation, ids


@pytest.fixture(autouse=True)
def narrow_window(settings):
    settings.MODEL_CONTEXT_TOKENS, settings.MODEL_MAX_TOKENS = 900, 100  # the lines fall out


def test_what_the_model_noted_of_a_turn_stands_in_for_the_rules_and_unnoted_turns_are_read(user):
    lines = [
        "I live in Leeds with my two cats.",
        "Honestly the thing I care about most is my allotment by the canal.",
        "I work as a nurse in Bradford.",
    ]
    conversation, ids = chat(user, lines)
    # The first turn noted (only the cats), the second noted as nothing, the third not yet.
    memory_writer.noted_store(
        conversation_id=conversation.id,
        message_id=ids[0],
        noted=memory_writer.noted_from_answer(
            answer(["my two cats"]), user_text=lines[0], assistant_text="", at=ids[0]
        ),
    )
    memory_writer.noted_store(
        conversation_id=conversation.id,
        message_id=ids[1],
        noted=memory_writer.noted_from_answer(
            answer([]), user_text=lines[1], assistant_text="", at=ids[1]
        ),
    )
    system = prompt_build(conversation=conversation).messages[0]["content"]
    assert '"my two cats"' in system and "Leeds" not in system.split("my two cats")[0][-200:]
    assert "allotment" not in system.split("own words")[-1].split("\n\n")[0]
    assert '"I work as a nurse in Bradford."' in system  # not noted: the rules read it


def test_a_newer_noted_statement_on_the_same_subject_shows_the_older_as_earlier(user):
    lines = ["I work as a nurse in Bradford.", "Update: I started a new job, teaching in York."]
    conversation, ids = chat(user, lines)
    for line, at in zip(lines, ids[: len(lines)], strict=True):
        noted = memory_writer.noted_from_answer(
            answer([line]), user_text=line, assistant_text="", at=at
        )
        memory_writer.noted_store(conversation_id=conversation.id, message_id=at, noted=noted)
    system = prompt_build(conversation=conversation).messages[0]["content"]
    assert 'Earlier: "I work as a nurse in Bradford"' in system
    assert '"Update: I started a new job, teaching in York"' in system


def test_a_summary_folds_noted_turns_in_and_keeps_what_waits(user):
    lines = ["I keep bees on my roof in Hackney.", "My partner Sam bakes sourdough."]
    conversation, ids = chat(user, lines)
    for line, at in zip(lines, ids[: len(lines)], strict=True):
        noted = memory_writer.noted_from_answer(
            answer([line.rstrip(".")]), user_text=line, assistant_text="", at=at
        )
        memory_writer.noted_store(conversation_id=conversation.id, message_id=at, noted=noted)
    folded_upto = Message.objects.get(request_id="w0").id  # the first exchange only
    memory_summary.summary_store(
        conversation_id=conversation.id, upto_message_id=folded_upto, text="Bees were discussed."
    )
    row = ConversationSummary.objects.get(conversation=conversation)
    entries = memory_facts.entries_from_json(row.facts)
    assert [(e.kind, e.value) for e in entries] == [
        (memory_facts.SAID, "I keep bees on my roof in Hackney"),
        (NOTED, "My partner Sam bakes sourdough"),
    ]
    # A turn the summary covers is not noted again.
    assert not memory_writer.noted_store(
        conversation_id=conversation.id, message_id=ids[0], noted=[]
    )


def test_only_models_the_operator_lets_write_memory_do(settings):
    settings.SLUICE_DEFAULT_MODEL = "smollm2"
    MemoryWriter.objects.create(model="smollm2", writes_memory=True)
    MemoryWriter.objects.create(model="big", writes_memory=False)
    memory_writer.writers_forget()
    assert memory_writer.writes_memory("smollm2") and memory_writer.writes_memory("")
    assert not memory_writer.writes_memory("big")
    memory_writer.writers_forget()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_on_the_real_stack_a_writing_model_notes_each_turn_in_the_background(
    short_answers, dispatcher, start_worker, live_web, user
):
    MemoryWriter.objects.create(model="", writes_memory=True)  # the default model
    roomy()
    start_worker("noting-w1")
    key = api_key_create(user=user, name="noting")[1]
    said = "I moved to Lyon in May and I work as a baker there. What bread is easiest to start?"
    conversation = conversation_create(owner=user)
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=live_web, headers=headers, timeout=120) as api:
        ask(api, said, conversation.id)
    message = Message.objects.get(conversation=conversation, role="user")

    def noted() -> list:
        row = ConversationSummary.objects.filter(conversation=conversation).first()
        entries = memory_facts.entries_from_json(row.facts if row else [])
        return [e for e in entries if e.kind == NOTED]

    wait_until(noted, timeout=180, what="the turn noted by the model")
    asked = [
        r
        for r in background_requests()
        if json.loads(r.get("purpose") or "{}").get("task") == "memory"
    ]
    assert len(asked) == 1 and asked[0]["state"] == "done"  # once per turn, through the line
    # Whatever the model chose, only the user's own words of that turn are kept.
    assert all(e.at == message.id and e.value in said for e in noted())
    print("noted:", [e.value for e in noted()])
