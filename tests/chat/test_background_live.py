"""One person chatting on the real stack (daphne, the dispatcher, a worker running SmolLM2 on
this machine's CPU): questions back to back, each waiting for its answer. The worker's own
decoding loads the machine, and that is not load on the service: it stays at degradation level
0 and every background task it asks for (the title, a follow-up after each answer, the
summaries of turns falling out of the window) runs and is written."""

from __future__ import annotations

import json

import httpx
import pytest

from apps.accounts.services import api_key_create
from apps.admission.selectors import degradation_get
from apps.chat import background, turns
from apps.chat.models import Conversation, ConversationSummary
from core.redis_client import get_redis, keys
from tests.chat.test_openai_api import roomy
from tests.conftest import read_sse, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

QUESTIONS = [
    "My name is Oriel and I keep bees. What is a sluice?",
    "How do sluice gates control a river?",
    "What is a mill race?",
    "Why do canals need locks?",
    "What do bees do in winter?",
    "What is my name?",
]


WINDOW = 240  # tokens: the turns of three exchanges fill it, summaries come due


@pytest.fixture
def all_background_work(monkeypatch, settings, short_answers):
    """Titles and follow-ups on (tests turn them off), and a small window, so summaries come
    due within a few questions; the web and the dispatcher read these from their environment
    (the window until the worker reports its own, the same). Requested before the processes
    start."""
    monkeypatch.setenv("SLUICE_TITLES", "1")
    monkeypatch.setenv("SLUICE_FOLLOWUPS", "1")
    monkeypatch.setenv("MODEL_CONTEXT_TOKENS", str(WINDOW))
    settings.SLUICE_TITLES, settings.MODEL_CONTEXT_TOKENS = True, WINDOW


def background_requests() -> list[dict]:
    client = get_redis()
    found = []
    for key in client.scan_iter(match=keys().request("*"), count=1000):
        fields = client.hgetall(key)
        if fields.get("kind") == "background":
            found.append(fields)
    return found


def ask(api: httpx.Client, text: str, conversation: int) -> None:
    body = {"text": text, "conversation": conversation}
    created = api.post("/api/v1/requests", json=body)
    while created.status_code == 409:  # the previous answer is being recorded
        created = api.post("/api/v1/requests", json=body)
    assert created.status_code == 202, created.text
    with api.stream("GET", created.json()["events_url"]) as events:
        final = read_sse(events)[-1]["data"]
    assert final["state"] == "done", final


def answered(request_id: str) -> bool:
    return get_redis().hget(keys().request(request_id), "state") == "done"


def test_one_person_asking_back_to_back_keeps_level_0_and_gets_all_background_work(
    all_background_work, dispatcher, start_worker, live_web, user
):
    back_to_back(QUESTIONS, user=user, live_web=live_web, start_worker=start_worker)


# Issue 40's measure: one user, 30 questions back to back, as on `make run`.
THIRTY = [
    *QUESTIONS,
    *(
        f"In one sentence, what is {topic}?"
        for topic in (
            "a weir",
            "a lock keeper",
            "a towpath",
            "a canal basin",
            "a flood gate",
            "a dam",
            "a reservoir",
            "a water wheel",
            "a culvert",
            "a spillway",
            "a levee",
            "an aqueduct",
            "a mill pond",
            "a sluice keeper",
            "a fish ladder",
            "a tide mill",
            "a dyke",
            "a polder",
            "a floodplain",
            "a river delta",
            "an estuary",
            "a marsh",
            "a beaver dam",
        )
    ),
    "What do I keep, and what is my name?",
]


def test_thirty_questions_back_to_back_keep_level_0_and_get_all_background_work(
    all_background_work, dispatcher, start_worker, live_web, user
):
    assert len(THIRTY) == 30
    back_to_back(THIRTY, user=user, live_web=live_web, start_worker=start_worker)


def back_to_back(questions: list[str], *, user, live_web, start_worker) -> None:
    """Asks `questions` in one conversation, each once the previous one is answered, then
    waits for every background task they asked for; asserts level 0 throughout and every
    task written."""
    roomy()
    # As `make run` starts it, with the small window: the worker reports it, prompts fit it.
    start_worker("quiet-w1", slots=2, extra=("--prompt-window", str(WINDOW)))
    key = api_key_create(user=user, name="quiet")[1]
    # The first question starts the chat as the page does (which asks for its title)...
    first = turns.conversation_start(user=user, text=questions[0])
    conversation = first.conversation_id
    wait_until(lambda: answered(first.request_id), timeout=120, what="the first answer")
    levels = [degradation_get()]
    # ...and the next ones go to the web process, each once the previous one is answered.
    with httpx.Client(
        base_url=live_web, headers={"Authorization": f"Bearer {key}"}, timeout=120
    ) as api:
        for text in questions[1:]:
            ask(api, text, conversation)
            levels.append(degradation_get())

    def settled() -> list[dict]:
        found = background_requests()
        ended = all(f.get("state") in ("done", "failed", "cancelled") for f in found)
        pending = background.summary_pending(conversation_id=conversation)
        # The last answer's follow-ups are asked once the dispatcher has recorded it.
        asked = sum(json.loads(f["purpose"])["task"] == "followups" for f in found)
        return found if ended and not pending and asked == len(questions) else []

    tasks = wait_until(settled, timeout=60 + 25 * len(questions), what="every background task")
    levels.append(degradation_get())
    assert [d.level for d in levels] == [0] * len(levels)
    # The CPU signal is Sluice's own processes' (the web publishes its share), not the
    # machine's load that the worker's decoding makes.
    assert any(name.startswith("web:") for name in get_redis().hgetall(keys().process_cpu()))
    assert levels[-1].sources["cpu"].startswith("busiest Sluice process")
    assert [f["state"] for f in tasks] == ["done"] * len(tasks), tasks
    named = [json.loads(f["purpose"])["task"] for f in tasks]
    assert named.count("followups") == len(questions) and "title" in named and "summary" in named
    assert ConversationSummary.objects.filter(conversation_id=conversation).exists()
    assert Conversation.objects.filter(id=conversation).exists()
    counts = get_redis().hgetall(keys().metrics)
    assert "requests:rejected:background" not in counts
    assert "requests:background_dropped" not in counts
    print(f"{len(questions)} questions: {len(tasks)} background tasks, all done: {named}")
