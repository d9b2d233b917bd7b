"""Request kinds: set by the server from what the request is, charged by the plan's weights;
background work never goes ahead of a person's request, waits while the service degrades
and is dropped quietly when its own wait runs out."""

from __future__ import annotations

import json

import pytest

from apps.admission.models import Plan
from core.redis_client import get_redis
from tests.admission.conftest import (
    counters,
    events,
    final,
    force_level,
    give_the_fleet_slots,
    keys,
    publish,
    roomy_plan,
    work_item_ids,
)
from tests.rag.conftest import FIXTURES, embedding_model, make_corpus  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db


@pytest.fixture
def third_user(db):
    from apps.accounts.services import user_create

    return user_create(username="carol", password="correct-horse-battery")


def charge_of(request_id: str) -> dict:
    return json.loads(get_redis().hget(keys().charges, request_id))


def test_each_kind_is_charged_by_its_plans_weight(make_dispatcher, user):
    roomy_plan(max_concurrent=10)
    Plan.objects.filter(slug="free").update(
        cost_weights={"chat": 1, "rag": 2, "long": 3, "background": 0.5}, long_prompt_tokens=500
    )
    give_the_fleet_slots(10)
    chat = publish(user.id, prompt_tokens=100, max_tokens=100)
    rag = publish(user.id, prompt_tokens=100, max_tokens=100, kind="rag")
    long = publish(user.id, prompt_tokens=900, max_tokens=100)  # over the plan's 500: long
    background = publish(user.id, prompt_tokens=100, max_tokens=100, kind="background")
    # A client cannot buy a cheaper kind: the web keeps only what Sluice itself sets.
    forged = publish(user.id, prompt_tokens=100, max_tokens=100, kind="cheap")
    make_dispatcher().step()
    # A cold estimator reserves max_tokens for the answer (the old rule), times the weight.
    assert [charge_of(r)["tokens"] for r in (chat, rag, long, background, forged)] == [
        200,
        400,
        3000,
        100,
        200,
    ]
    assert [charge_of(r)["w"] for r in (chat, rag, long, background, forged)] == [1, 2, 3, 0.5, 1]
    sent = {f["id"]: f["kind"] for _, f in get_redis().xrange(keys().work)}
    assert sent == {
        chat: "chat",
        rag: "rag",
        long: "long",
        background: "background",
        forged: "chat",
    }


def test_a_weighted_answer_is_settled_at_its_weight(make_dispatcher, user):
    from tests.admission.conftest import worker_answers

    roomy_plan(burst_tokens=10_000, tokens_per_minute=1)  # refills ~nothing during the test
    Plan.objects.filter(slug="free").update(cost_weights={"chat": 1, "rag": 3})
    give_the_fleet_slots(2)
    dispatcher = make_dispatcher()
    rag = publish(user.id, prompt_tokens=100, max_tokens=900, kind="rag")  # charged 3000
    dispatcher.step()
    worker_answers(rag, prompt_tokens=100, completion_tokens=100)  # used 200: 600 at weight 3
    dispatcher.step()
    # What is left: 10,000 - 600 (at weight 1 it would be 9,800): 9,401 tokens must wait.
    too_many = publish(user.id, prompt_tokens=8501, max_tokens=900)
    dispatcher.step()
    assert not dispatcher.line.requests[too_many].charged
    assert dispatcher.line.requests[too_many].held_by == "tpm"


def test_background_work_never_goes_ahead_of_a_persons_request(
    make_dispatcher, user, other_user, third_user
):
    roomy_plan(max_concurrent=10)
    dispatcher = make_dispatcher()
    # Background work queued first, by several users, then people's requests arrive.
    summaries = [publish(u.id, kind="background") for u in (user, other_user) for _ in range(3)]
    dispatcher.step()
    people = [publish(u.id) for u in (third_user, user, other_user)]
    dispatcher.step()
    # Positions: every person is ahead of every background request.
    place = {
        r: int([e for e in events(r) if e.get("position")][-1]["position"])
        for r in summaries + people
    }
    assert max(place[r] for r in people) < min(place[r] for r in summaries)
    give_the_fleet_slots(4)
    dispatcher.step()
    released = work_item_ids(keys().work)
    assert set(released[:3]) == set(people)
    assert len(released) == 4  # the fourth slot: background work, with no person waiting
    assert released[3] in summaries


def test_a_person_who_arrives_after_background_work_takes_the_next_slot(
    make_dispatcher, user, other_user
):
    roomy_plan(max_concurrent=2)
    give_the_fleet_slots(1, running=())
    dispatcher = make_dispatcher()
    person = publish(user.id)
    dispatcher.step()
    assert work_item_ids(keys().work) == [person]
    # The worker is busy with it: a background request waits even though the line is short.
    summary = publish(other_user.id, kind="background")
    second = publish(other_user.id)
    give_the_fleet_slots(2, running=(person,))
    dispatcher.step()
    assert second in work_item_ids(keys().work)
    assert summary not in work_item_ids(keys().work)


def test_background_work_waits_under_degradation_and_runs_when_the_line_is_quiet(
    make_dispatcher, user
):
    roomy_plan()
    dispatcher = make_dispatcher()
    give_the_fleet_slots(4)
    force_level(1)
    dispatcher.plans.refresh(force=True)
    dispatcher.publish_degradation()
    summary = publish(user.id, kind="background")
    person = publish(user.id)
    dispatcher.step()
    dispatcher.step()
    assert work_item_ids(keys().work) == [person]  # people are still served at level 1
    assert final(summary) is None and summary in dispatcher.line  # waiting, not refused
    force_level(0)
    dispatcher.plans.refresh(force=True)
    dispatcher.publish_degradation()
    dispatcher.step()
    assert work_item_ids(keys().work) == [person, summary]
    assert "requests:rejected:background" not in counters()


def background_with_wait(user_id, *, wait_s: float) -> str:
    from apps.chat.submission import request_publish
    from contract.protocol import WorkItem, new_request_id

    item = WorkItem(
        id=new_request_id(),
        user_id=str(user_id),
        conversation_id="",
        messages=[{"role": "user", "content": "Suggest questions."}],
        max_tokens=32,
        kind="background",
        purpose={"task": "followups", "conversation": 1, "wait_s": wait_s},
    )
    request_publish(item=item)
    return item.id


def test_the_page_sets_rag_when_passages_are_attached_and_chat_otherwise(
    admission,
    make_corpus,  # noqa: F811
    user,
):
    from apps.chat.services import conversation_create
    from apps.chat.submission import Question, request_submit

    def submitted_kind(text: str) -> str:
        conversation = conversation_create(owner=user)
        request_id = request_submit(
            Question(user=user, conversation=conversation, text=text)
        ).request_id
        entry = next(f for _, f in get_redis().xrange(keys().admit) if f["id"] == request_id)
        return entry["kind"]

    assert submitted_kind("How many days of paid vacation do I get?") == "chat"  # no corpus
    make_corpus("handbook", paths=[FIXTURES / "handbook"])
    assert submitted_kind("How many days of paid vacation do I get?") == "rag"


def test_background_work_whose_wait_runs_out_is_dropped_without_an_error(
    make_dispatcher, user, clock
):
    roomy_plan()
    dispatcher = make_dispatcher()
    force_level(1)
    dispatcher.plans.refresh(force=True)
    dispatcher.publish_degradation()
    followups = background_with_wait(user.id, wait_s=5)
    person = publish(user.id)
    dispatcher.step()
    assert final(followups) is None
    clock.now += 6
    dispatcher.step()
    end = final(followups)
    assert end["state"] == "cancelled" and end["code"] == "dropped" and not end["error"]
    assert followups not in dispatcher.line and not get_redis().hexists(keys().queue, followups)
    assert person in dispatcher.line  # people keep their place
    assert counters()["requests:background_dropped"] == 1


def test_a_running_summary_never_holds_its_users_own_question_back(make_dispatcher, user):
    # One request at a time for this user, and a summary of theirs already running.
    roomy_plan(max_concurrent=1)
    give_the_fleet_slots(4)
    dispatcher = make_dispatcher()
    summary = publish(user.id, kind="background")
    dispatcher.step()
    assert work_item_ids(keys().work) == [summary]
    question = publish(user.id)
    dispatcher.step()
    assert work_item_ids(keys().work) == [summary, question]


def test_background_work_has_its_own_allowance_and_a_takeover_keeps_it(make_dispatcher, user):
    roomy_plan(max_concurrent=3, max_background_concurrent=1)
    give_the_fleet_slots(6)
    first = make_dispatcher()
    summaries = [publish(user.id, kind="background") for _ in range(2)]
    first.step()
    assert work_item_ids(keys().work) == summaries[:1]  # the second waits for the first
    first.release_lease()
    # The dispatcher that takes over counts the running summary as background work too: the
    # person still has all three of their places, and the second summary still waits.
    standby = make_dispatcher()
    questions = [publish(user.id) for _ in range(3)]
    standby.step()
    assert work_item_ids(keys().work) == [summaries[0], *questions]
    assert summaries[1] in standby.line
