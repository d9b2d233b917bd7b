"""bench/estimates.py's workload and text-aware baselines: never-learned phrasings share no
template with the learned ones and no opener or tail gives a class away; the medians fall back
along their chain."""

from __future__ import annotations

import sys
from collections import defaultdict

from tests.conftest import BASE_DIR

sys.path.insert(0, str(BASE_DIR / "bench"))

from estimates_data import LEARN, NEVER, OPENERS, TAILS, workload
from estimates_text import BagOfWords, Medians


def test_never_learned_phrasings_are_their_own_and_openers_and_tails_say_nothing_of_the_class():
    learned = {core for cores in LEARN.values() for core in cores}
    assert not learned & {core for cores in NEVER.values() for core in cores}
    wrappers = defaultdict(set)  # (opener, tail) seen per class
    for answer in workload(3000, 50, seed=2):
        if answer.kind == "background":
            continue
        size = answer.template.removeprefix("never:").split("/")[0]
        opener = next(
            o
            for o in sorted(OPENERS, key=len, reverse=True)
            if answer.question.lower().startswith(o.lower())
        )
        tail = next(t for t in sorted(TAILS, key=len, reverse=True) if answer.question.endswith(t))
        wrappers[size].add((opener, tail))
        assert answer.never == answer.template.startswith("never:")
    assert wrappers["short"] == wrappers["medium"] == wrappers["long"]


def test_a_median_with_too_few_answers_falls_back_along_its_chain():
    medians = Medians({"per template": 10, "per user": 10, "global median": 10})
    for real in (100, 200, 300):
        medians.learn("per user", ("u1",), real)
        medians.learn("global median", (), real)
    chain = [("per template", ("t1",)), ("per user", ("u1",))]
    assert medians.guess(chain, max_tokens=512) == 200
    for real in (10, 20, 30):
        medians.learn("per template", ("t1",), real)
    assert medians.guess(chain, max_tokens=512) == 20
    assert medians.guess([("per user", ("u2",))], max_tokens=150) == 150  # capped


def test_the_bag_of_words_learns_which_words_ask_for_long_answers():
    words = BagOfWords()
    assert words.guess(question="hi", kind="chat", prompt=50, max_tokens=512) is None
    for i in range(300):
        question, real = ("the whole saga please", 400) if i % 2 else ("a number please", 10)
        words.learn(question=question, kind="chat", prompt=50, max_tokens=512, real=real)
    long = words.guess(question="the whole saga please", kind="chat", prompt=50, max_tokens=512)
    short = words.guess(question="a number please", kind="chat", prompt=50, max_tokens=512)
    assert short < 40 < 200 < long
