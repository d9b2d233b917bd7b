"""Answer-length estimates: learned from real answers through the dispatcher, better than the old
rule on a skewed workload, reserved in the buckets, shown in /metrics, and inherited by the
dispatcher that takes over."""

from __future__ import annotations

import json
import math

import pytest

from apps.admission.estimates import FEATURES, MIN_SAMPLES, Estimator, Sample, question_of
from apps.admission.models import Plan
from apps.chat.submission import request_publish
from contract.protocol import WorkItem, new_request_id
from core.redis_client import get_redis
from tests.admission.conftest import give_the_fleet_slots, keys, roomy_plan, worker_answers

pytestmark = pytest.mark.django_db

MAX_TOKENS = 512
SHORT, LONG = "What is the capital of France?", "Explain in detail how a bread oven works."


def ask(user_id, question: str, *, max_tokens: int = MAX_TOKENS) -> str:
    item = WorkItem(
        id=new_request_id(),
        user_id=str(user_id),
        conversation_id="999999",
        messages=[
            {"role": "system", "content": "You are Sluice."},
            {"role": "user", "content": question},
        ],
        max_tokens=max_tokens,
        temperature=0.0,
        prompt_tokens_estimate=20 + len(question) // 4,
    )
    request_publish(item=item)
    return item.id


def real_length(user, other_user, user_id: str, question: str, i: int) -> int:
    """The skew: long questions get answers ~10x longer; one user writes 4x more than the
    other; a little spread around each."""
    base = 300 if question == LONG else 30
    lean = 1.0 if user_id == str(user.id) else 0.25
    return max(1, min(MAX_TOKENS, round(base * lean * (1.15 if i % 2 else 0.87))))


def run_workload(dispatcher, user, other_user, rounds: int) -> list[str]:
    """`rounds` batches of four requests (each user, each kind of question), answered."""
    ids = []
    for r in range(rounds):
        batch = []
        for who in (user, other_user):
            for question in (SHORT, LONG):
                request_id = ask(who.id, question)
                batch.append((request_id, str(who.id), question))
        dispatcher.step()
        for i, (request_id, user_id, question) in enumerate(batch):
            worker_answers(
                request_id,
                prompt_tokens=30,
                completion_tokens=real_length(user, other_user, user_id, question, r + i),
            )
        dispatcher.step()  # the recorder pass settles them: the estimator learns
        ids += [b[0] for b in batch]
    return ids


def test_the_learned_estimate_beats_the_max_tokens_rule_on_a_skewed_workload(
    make_dispatcher, user, other_user
):
    roomy_plan(max_concurrent=100)
    give_the_fleet_slots(100)
    dispatcher = make_dispatcher()
    run_workload(dispatcher, user, other_user, rounds=(MIN_SAMPLES + 40) // 4)
    dispatcher.reconcile.save_learning(force=True)  # written at most once a second otherwise
    gauges = {
        k: float(v)
        for k, v in get_redis().hgetall(keys().metrics).items()
        if k.startswith("gauge:estimate")
    }
    # The rule reserves 512 for answers of 8 to 345 tokens: off by several times, every time.
    assert gauges["gauge:estimate_rule_median_ape"] > 0.5
    # The first MIN_SAMPLES guesses were the rule's too; the rest learned.
    assert gauges["gauge:estimate_median_ape"] < gauges["gauge:estimate_rule_median_ape"] / 2
    # Once learned, a terse user's short question reserves a small answer, a wordy user's long
    # question a long one, and both are close to what they really take.
    terse = ask(other_user.id, SHORT)
    wordy = ask(user.id, LONG)
    dispatcher.step()
    charges = get_redis().hmget(keys().charges, [terse, wordy])
    terse_charge, wordy_charge = (json.loads(c) for c in charges)
    assert terse_charge["est"] < 20 < 200 < wordy_charge["est"] < MAX_TOKENS
    assert abs(math.log(terse_charge["est"] / 8)) < math.log(1.6)
    assert abs(math.log(wordy_charge["est"] / 300)) < math.log(1.6)
    # The buckets were charged the estimate, not max_tokens.
    assert terse_charge["tokens"] == terse_charge["est"] + 20 + len(SHORT) // 4
    # A small estimate does not let through a request whose cap the plan could never pay.
    Plan.objects.filter(slug="free").update(burst_tokens=1000, max_tokens_cap=5000)
    dispatcher.plans.refresh(force=True)
    capped = ask(other_user.id, SHORT, max_tokens=2000)
    dispatcher.step()
    assert get_redis().hget(keys().request(capped), "state") == "failed"


def test_a_standby_that_takes_over_inherits_what_was_learned(make_dispatcher, user, other_user):
    roomy_plan(max_concurrent=100)
    give_the_fleet_slots(100)
    first = make_dispatcher()
    run_workload(first, user, other_user, rounds=MIN_SAMPLES // 4 + 3)
    learned = first.estimator
    first.release_lease()
    standby = make_dispatcher()
    assert standby.estimator.samples == 0
    standby.step()  # takes the lease and loads the state from Redis
    assert standby.estimator.samples == learned.samples >= MIN_SAMPLES
    for who, question in ((user, LONG), (other_user, SHORT)):
        asked = dict(
            kind="chat",
            user_id=str(who.id),
            plan="free",
            prompt_tokens=20 + len(question) // 4,
            max_tokens=MAX_TOKENS,
            question=question,
        )
        assert standby.estimator.guess(**asked).tokens == learned.guess(**asked).tokens
    kept, had = standby.estimator.stats(), learned.stats()
    assert kept.samples == had.samples
    assert kept.median_ape == pytest.approx(had.median_ape, abs=1e-3)


def test_stopped_answers_teach_nothing_and_a_garbled_state_is_relearned(make_dispatcher, user):
    roomy_plan()
    give_the_fleet_slots(4)
    dispatcher = make_dispatcher()
    request_id = ask(user.id, SHORT)
    dispatcher.step()
    worker_answers(request_id, completion_tokens=0)  # nothing generated: nothing to learn
    dispatcher.step()
    assert dispatcher.estimator.samples == 0
    get_redis().set(keys().estimates("model"), "{not json")
    estimator = Estimator(keys())
    estimator.load(get_redis())
    assert estimator.samples == 0
    guess = estimator.guess(
        kind="chat", user_id="1", plan="free", prompt_tokens=10, max_tokens=300, question="hi"
    )
    assert guess.tokens == 300  # the old rule


def test_metrics_and_the_ops_page_show_the_estimates_error(
    make_dispatcher, user, other_user, client_for
):
    roomy_plan(max_concurrent=100)
    give_the_fleet_slots(100)
    run_workload(make_dispatcher(), user, other_user, rounds=MIN_SAMPLES // 4 + 3)
    user.is_staff = user.is_superuser = True
    user.save()
    staff = client_for(user)
    body = staff.get("/metrics").content.decode()
    line = next(
        x
        for x in body.splitlines()
        if x.startswith('sluice_estimate_error_median{estimator="learned"}')
    )
    assert float(line.split()[-1]) >= 0
    assert 'sluice_estimate_underestimated_share{estimator="max_tokens rule"}' in body
    page = staff.get("/admin/ops/").content.decode()
    assert "Answer-length estimate" in page


def test_the_words_that_ask_for_a_long_answer_are_learned_from_the_answers():
    """No list says which words ask for a long answer: the answers teach it, and a standby
    inherits the word weights."""
    terse = "Redis, in a sentence?"
    thorough = "Redis: the full story, please, with all its corners."
    estimator = Estimator(keys())
    asked = dict(kind="chat", user_id="7", plan="free", prompt_tokens=40, max_tokens=MAX_TOKENS)
    for i in range(120):
        question, real = (terse, 20) if i % 2 else (thorough, 300)
        guess = estimator.guess(**asked, question=question)
        estimator.learn([Sample(guess.x, guess.tokens, MAX_TOKENS, "7", "free", real)])
    short, long = (estimator.guess(**asked, question=q).tokens for q in (terse, thorough))
    assert short < 40 and long > 150
    pipe = get_redis().pipeline()
    estimator.save(pipe, force=True)
    pipe.execute()
    standby = Estimator(keys())
    standby.load(get_redis())
    assert standby.guess(**asked, question=thorough).tokens == long


def test_the_previous_releases_model_is_read_without_its_keyword_features():
    """A dispatcher of this release taking over from one of the previous release keeps what it
    learned for the features both have (its model had two keyword features more)."""
    estimator = Estimator(keys())
    asked = dict(kind="rag", user_id="7", plan="free", prompt_tokens=900, max_tokens=MAX_TOKENS)
    for _ in range(60):
        guess = estimator.guess(**asked, question="")
        estimator.learn([Sample(guess.x, guess.tokens, MAX_TOKENS, "7", "free", 90)])
    learned = estimator.guess(**asked, question="").tokens
    size = len(FEATURES)
    previous = {  # the same statistics with two more features that never fired
        "a": [[*row, 0.0, 0.0] for row in estimator.a] + [[0.0] * (size + 2)] * 2,
        "b": [*estimator.b, 0.0, 0.0],
        "n": estimator.samples,
        "plans": estimator.plans,
        "words": estimator.words,
    }
    get_redis().set(keys().estimates("model"), json.dumps(previous))
    get_redis().hset(keys().estimates("users"), mapping={"7": estimator.users["7"]})
    standby = Estimator(keys())
    standby.load(get_redis())
    assert standby.samples == estimator.samples
    assert standby.guess(**asked, question="").tokens == learned


def test_the_question_is_read_without_decoding_the_prompt():
    messages = json.dumps(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Old question"},
            {"role": "assistant", "content": "Old answer"},
            {"role": "user", "content": "Explain TCP"},
        ]
    )
    assert question_of(messages) == "Explain TCP"
    assert question_of("[]") == ""


@pytest.mark.slow
def test_the_real_dispatcher_learns_from_a_real_workers_usage(
    transactional_db, admission, user, other_user, start_worker, dispatcher
):
    from tests.admission.conftest import force_level
    from tests.conftest import wait_until

    force_level(0)
    roomy_plan(max_concurrent=50)
    # The simulated engine answers with the length a marker in the question sets.
    start_worker(
        "w-sim",
        engine="simulated",
        slots=16,
        extra=["--sim-decode-ms", "1", "--sim-first-token-ms", "5"],
    )
    ids = []

    def all_done() -> bool:
        return all(get_redis().hget(keys().request(r), "state") == "done" for r in ids)

    def learned() -> str | None:
        raw = get_redis().get(keys().estimates("model"))
        return raw if raw and json.loads(raw)["n"] >= len(ids) else None

    for i in range(MIN_SAMPLES + 20):
        short = i % 2 == 0
        question = (
            f"{SHORT} [[sim:tokens={8 + i % 3}]]"
            if short
            else f"{LONG} [[sim:tokens={200 + i % 7}]]"
        )
        ids.append(ask((user if i % 4 < 2 else other_user).id, question))
        if i % 10 == 9:  # in waves, so later ones are predicted from the earlier answers
            wait_until(all_done, timeout=60, what="the wave's answers")
    model = wait_until(learned, timeout=30, what="every answer learned")
    assert json.loads(model)["n"] == len(ids)
    gauges = get_redis().hgetall(keys().metrics)
    assert float(gauges["gauge:estimate_median_ape"]) < float(
        gauges["gauge:estimate_rule_median_ape"]
    )
