"""Memory that tells the truth: the user's facts as subject/value entries (a correction
replaces the value, facts inside questions count, other people's statements stay theirs,
requests and small talk are no facts), only grounded third-person summary sentences that
tell the user nothing said of someone else, a budget with a rule for what leaves first, and
the page's note: the prompt's memory block, whose entries the user corrects or deletes. Also
what the conversation's order decides: an edit keeps a summary whose last turn survives it,
and an export counts covered turns in order."""

from __future__ import annotations

import pytest

from apps.chat import background, turns
from apps.chat.data.export import conversation_export_data, conversation_import
from apps.chat.models import ConversationSummary, Message
from apps.chat.prompt import memory, memory_facts, memory_summary
from apps.chat.prompt.prompting import prompt_build
from apps.chat.selectors import PromptSources, Turn, prompt_sources
from apps.chat.services import conversation_create, message_create
from core.redis_client import get_redis, keys
from tests.chat.test_memory import (
    chat_with_an_answer_stored_after_the_next_question,
    record_answer,
)

pytestmark = pytest.mark.django_db

FILLER = "Tell me about river number {n} and how its banks are shaped."
ANSWER = "River {n} runs past farms and mills; its banks are " + "mud " * 20


@pytest.fixture(autouse=True)
def cold(settings):
    settings.HOT_TIER = False  # one transaction: the hot tier's after-commit writes never run


@pytest.fixture
def small_window(settings):
    settings.MODEL_CONTEXT_TOKENS, settings.MODEL_MAX_TOKENS = 900, 100


def chat(user, said: list[str], *, fillers: int = 24):
    """The user's lines first, each answered, then `fillers` exchanges that push them out of
    the window, then a closing question."""
    conversation = conversation_create(owner=user)
    for n, text in enumerate([*said, *(FILLER.format(n=n) for n in range(fillers))]):
        message_create(conversation=conversation, role="user", text=text)
        message_create(
            conversation=conversation, role="assistant", request_id=f"a{n}", text=ANSWER.format(n=n)
        )
    message_create(conversation=conversation, role="user", text="What do you know about me?")
    return conversation


def system_of(conversation) -> str:
    return prompt_build(conversation=conversation).messages[0]["content"]


def found(text: str) -> dict[str, str]:
    return {e.key: e.text() for e in memory_facts.facts_of(text, at=1)}


def test_facts_come_from_statements_and_questions_not_requests_or_small_talk():
    assert found("Is it usually cold in winter near my flat in Tartu?") == {
        "city": "The user lives in Tartu."
    }
    assert found("What stretches help a radiographer like me who stands all day?") == {
        "job": "The user's job: radiographer."
    }
    assert found("My flight is BA 212. What gate is my flight at?") == {
        "code:flight": "The user's flight is BA 212."
    }
    for nothing in (
        "Suggest a relaxing hobby I could pick up.",
        "Our team meeting ran two hours over today.",
        "What is the capital of France?",
        "As a beginner, should I stretch first?",  # no job named
        "Remind me: which city I live in now and what my gym locker code is now?",
    ):
        assert found(nothing) == {}, nothing


def test_statements_about_other_people_are_theirs():
    found = memory_facts.facts_of(
        "My sister lives in Porto and works as a librarian. My boss has a cat called Mochi.", at=1
    )
    assert [(e.kind, e.text()) for e in found] == [
        ("other", "The user's sister lives in Porto and works as a librarian."),
        ("other", "The user's boss has a cat called Mochi."),
    ]


def test_a_statement_about_someone_else_is_theirs_wherever_it_names_them():
    assert [
        (e.kind, e.text())
        for e in memory_facts.facts_of(
            "Last week my cousin moved to Gdansk. Noor, my flatmate, is allergic to kiwi.", at=1
        )
    ] == [
        ("other", "Last week the user's cousin moved to Gdansk."),
        ("other", "Noor, the user's flatmate, is allergic to kiwi."),
    ]


def test_a_summary_never_tells_the_user_what_they_said_of_someone_else():
    said = (
        "My aunt lives in Mombasa and works as an architect. Anyway, what is a black hole?\n"
        "My colleague Farah is allergic to sesame, she told everyone.\n"
        "I live in Leuven and I work as a nurse."
    )
    answer = (
        "She lives in Mombasa and works as an architect.\n"  # the aunt's, as the user's
        "He told everyone else he was allergic to sesame.\n"
        "I live in Mombasa.\n"
        "The user lives in Leuven and works as a nurse.\n"
        "The user's aunt lives in Mombasa."
    )
    assert memory_summary.summary_text(previous="", answer=answer, said=said) == (
        "The user lives in Leuven and works as a nurse.\nThe user's aunt lives in Mombasa."
    )
    # What the notes so far said of someone else is theirs too.
    assert memory_summary.summary_text(
        previous="The user's aunt lives in Mombasa.",
        answer="The user lives in Mombasa.",
        said="I went for a run this morning.",
    ) == ("The user's aunt lives in Mombasa.")
    # What the user said of themselves as well stays theirs to say.
    said = "My aunt lives in Mombasa. We live in Mombasa too."
    answer = "The user lives in Mombasa."
    assert memory_summary.summary_text(previous="", answer=answer, said=said) == answer


def test_a_stored_summary_names_someone_elses_detail_only_saying_whose_it_is():
    entries = [
        *memory_facts.facts_of("My aunt lives in Mombasa.", at=1),
        *memory_facts.facts_of("My son moved to Tucson.", at=2),
    ]
    summary = (
        "The user lives in Mombasa.\n"  # "Mombasa" holds "mom", "Tucson" "son": no one's
        "The user moved to Tucson last year.\n"
        "The user's aunt lives in Mombasa."
    )
    assert memory_summary.summary_lines(summary, entries) == ["The user's aunt lives in Mombasa."]


def test_a_correction_replaces_the_value_and_the_old_one_is_never_current(user, small_window):
    conversation = chat(
        user,
        ["I live in Tallinn.", "My gym locker code is 4471."],
        fillers=12,
    )
    late = ["Quick update: we moved house last month, we're in Tartu now."]
    late += ["The gym reset all the lockers, so my new locker code is 9902."]
    for n, text in enumerate(late):
        message_create(conversation=conversation, role="user", text=text)
        message_create(conversation=conversation, role="assistant", request_id=f"b{n}", text="Ok.")
    for n in range(12):
        message_create(conversation=conversation, role="user", text=FILLER.format(n=n))
        message_create(
            conversation=conversation, role="assistant", request_id=f"c{n}", text=ANSWER.format(n=n)
        )
    message_create(conversation=conversation, role="user", text="Where do I live?")
    # A summary written before the corrections still says the old values.
    first_answer = conversation.messages.get(request_id="a3")
    memory_summary.summary_store(
        conversation_id=conversation.id,
        upto_message_id=first_answer.id,
        text="The user lives in Tallinn.\nThe user's gym locker code is 4471.",
    )
    system = system_of(conversation)
    assert "The user lives in Tartu (formerly Tallinn)." in system
    assert "locker code is 9902 (formerly 4471)." in system
    assert "The user lives in Tallinn." not in system  # the summary's stale sentence is gone
    assert "locker code is 4471." not in system


def test_only_grounded_third_person_summary_sentences_are_kept():
    said = "My name is Oriel and I keep bees.\nWe moved to Tartu last year."
    answer = (
        "I'm glad to hear that you're enjoying your time at the local pub.\n"
        "The user mentioned a lunar eclipse that occurs every 18 months.\n"
        "The user is called Oriel and keeps bees.\n"
        "We moved to Tartu last year.\n"
        "You should visit Tallinn."
    )
    assert memory_summary.summary_text(previous="", answer=answer, said=said) == (
        'The user is called Oriel and keeps bees.\nThe user said: "We moved to Tartu last year."'
    )
    # Nothing grounded: the notes so far stay.
    assert memory_summary.summary_text(previous="Old notes.", answer=answer[:66], said=said) == (
        "Old notes."
    )


def test_the_memory_block_has_a_budget_and_other_people_leave_it_first():
    said = [f"My friend Noor{n} works as a pilot in Leuven{n}." for n in range(30)]
    said += ["I live in Tartu.", "My cat is called Miso.", "I'm allergic to peanuts."]
    history = [Turn(n + 1, "user", text) for n, text in enumerate(said)]
    sources = PromptSources(history=list(reversed(history)), profile=None)
    entries = memory.entries_for(sources)
    block = memory.remembered(sources=sources, entries=entries, budget=120, pinned=[])
    assert [e.value for e in block.facts] == ["peanuts", "Miso", "Tartu"]  # newest first
    assert 0 < len(block.others) < 30 and block.left_out == 30 - len(block.others)
    assert block.others[0].value.startswith("The user's friend Noor29 ")  # the oldest left
    assert memory.estimate_tokens(block.text) <= 120 + 40  # three headings beside the lines


def test_the_note_shows_the_prompts_memory_and_the_user_corrects_and_deletes_entries(
    user, other_user, client_for, small_window
):
    conversation = chat(user, ["I live in Tallinn.", "My boss has a cat called Mochi."])
    page = client_for(user).get(f"/c/{conversation.id}/").content.decode()
    system = system_of(conversation)
    assert "The user lives in Tallinn." in page and "The user lives in Tallinn." in system
    assert "boss has a cat called Mochi." in page and "boss has a cat called Mochi." in system
    url = f"/c/{conversation.id}/memory/"
    assert client_for(other_user).post(url, {"key": "city", "value": "Oslo"}).status_code == 404

    response = client_for(user).post(url, {"key": "city", "value": "Tartu", "action": "save"})
    assert response.status_code == 302 and response["Location"].endswith("?memory=1#memory-note")
    system = system_of(conversation)
    assert "The user lives in Tartu." in system and "Tallinn" not in system.split("\n\n", 1)[1]
    boss = next(e.key for e in memory.entries_for(sources_of(conversation)) if "boss" in e.value)
    client_for(user).post(url, {"key": boss, "action": "delete"})
    system = system_of(conversation)
    assert "Mochi" not in system
    page = client_for(user).get(f"/c/{conversation.id}/?memory=1").content.decode()
    assert "The user lives in Tartu." in page and "Mochi" not in page.split("memory-note")[1]

    # A later turn says otherwise: the user's own words win again.
    message_create(conversation=conversation, role="user", text="We moved to Riga last week.")
    assert "The user lives in Riga (formerly Tartu)." not in system_of(conversation)
    assert "The user lives in Riga." in system_of(conversation)


def sources_of(conversation):
    return prompt_sources(conversation=conversation, limit=100)


def test_the_note_says_summary_pending_until_it_is_written(
    user, client_for, small_window, settings
):
    settings.SLUICE_ADMISSION = True
    conversation = chat(user, ["My name is Oriel and my locker code is 4471."])
    prompt = prompt_build(conversation=conversation)
    request_id = background.summary_schedule(conversation=conversation, prompt=prompt)
    page = client_for(user).get(f"/c/{conversation.id}/").content.decode()
    assert "summary pending" in page
    record_answer(request_id, user.id, "The user is Oriel; locker code 4471.")
    page = client_for(user).get(f"/c/{conversation.id}/").content.decode()
    assert "summary pending" not in page and "The user is Oriel; locker code 4471." in page


def test_an_edit_keeps_a_summary_whose_last_turn_comes_before_the_edited_question(user):
    conversation = chat_with_an_answer_stored_after_the_next_question(user)
    late_answer = conversation.messages.get(request_id="a10")
    next_question = conversation.messages.get(text__startswith="Tell me about river number 11 ")
    assert late_answer.id > next_question.id  # stored later, said earlier
    memory_summary.summary_store(
        conversation_id=conversation.id, upto_message_id=late_answer.id, text="Rivers 0 to 10."
    )
    turns.message_edit(
        user=user, conversation=conversation, message_id=next_question.id, text="And river 12?"
    )
    summary = ConversationSummary.objects.get(conversation=conversation)  # still there
    assert summary.upto_message_id == late_answer.id
    # An edit of a question the summary covers discards it (once that answer has ended).
    get_redis().delete(keys().conversation_active(conversation.id))
    ten = conversation.messages.get(text__startswith="Tell me about river number 10 ")
    turns.message_edit(user=user, conversation=conversation, message_id=ten.id, text="Hi?")
    assert not ConversationSummary.objects.filter(conversation=conversation).exists()


def test_an_export_counts_the_turns_a_summary_covers_in_the_conversations_order(user):
    conversation = chat_with_an_answer_stored_after_the_next_question(user)
    next_question = conversation.messages.get(text__startswith="Tell me about river number 11 ")
    memory_summary.summary_store(
        conversation_id=conversation.id, upto_message_id=next_question.id, text="Rivers 0 to 11."
    )
    ordered = list(conversation.messages.order_by("created", "id"))
    data = conversation_export_data(conversation=conversation)
    assert data["summary"]["covers"] == ordered.index(next_question) + 1
    copy = conversation_import(owner=user, data=data)
    upto = Message.objects.get(id=copy.summary.upto_message_id)
    assert upto.text == next_question.text and upto.role == "user"
