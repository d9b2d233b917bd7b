"""Conversations for bench/memory.py: facts about the user planted in five placements among
realistic filler turns, and a closing question that asks for them without naming them.

Placements (one fact each per conversation, on five different subjects):

  user       the user states it ("I work as a radiographer.")
  question   it sits inside the user's question ("...near my flat in Tallinn?")
  assistant  the assistant names it and the user confirms without repeating it
  corrected  stated early, corrected later; only the newest value is current
  implied    it shows in passing ("The ferry back to Tartu was late again...")

Filler user turns are what people write: statements, small talk, requests, statements about
other people (with values of the same kinds, so they compete for the memory's budget), and
questions; not all of them end in "?".
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from memory_facts import (
    ALLERGIES,
    CITIES,
    JOBS,
    PARTNERS,
    PETS,
    PLACEMENTS,
    SUBJECTS,
    random_code,
    with_article,
)

from apps.chat.selectors import Turn

__all__ = [
    "HELDOUT",
    "PLACEMENTS",
    "TUNING",
    "Conversation",
    "Fact",
    "load_independent",
    "make_conversation",
]

# The independent set: conversations written by people who never read the memory's code or
# this generator, frozen before the first run against it (never edited to fit).
INDEPENDENT = sorted((Path(__file__).resolve().parent / "data").glob("memory_independent_*.jsonl"))
# Written sets for tuning: by more writers who never read the memory's code, in the same form;
# rules are tuned on them (and on the generated set), never on the independent set.
TUNING = sorted((Path(__file__).resolve().parent / "data").glob("memory_tuning*.jsonl"))
# Held-out sets, written like the independent one by writers who never read the code or the
# other sets, each frozen before its first run: for rules chosen after the independent set (and
# later set `_g`) had been read for ablations (docs/benchmarks.md says which).
HELDOUT = sorted((Path(__file__).resolve().parent / "data").glob("memory_heldout_*.jsonl"))


@dataclass
class Fact:
    subject: str
    placement: str
    value: str  # the current value: what must reach the prompt
    old: str = ""  # corrected facts: the value that must not be presented as current
    asked: str = ""  # how the closing question asks for it ("which city I live in")
    question: str = ""  # how a single question asks for it ("Which city do I live in?")
    # Corrected facts: the user's turn that first names the current value, the correction. Its
    # own sentences that name the old value ("Valencia had no places left.") are the correction
    # too, not the old value presented as current.
    corrected_in: str = ""


@cache
def _value_re(value: str) -> re.Pattern[str]:
    # Not a word's part on either side: "\b" would need a word character at the value's own
    # edge, and so never find "£850", "$2,200" or "68%" in "now got £850." or "to 68% like".
    return re.compile(rf"(?<!\w){re.escape(value)}(s|es)?(?!\w)", re.IGNORECASE)


def has(value: str, text: str) -> bool:
    return bool(_value_re(value).search(text))


def with_corrections(turns: list[Turn], facts: list[Fact]) -> None:
    """Sets each corrected fact's `corrected_in`: the first user turn that names its value."""
    for fact in facts:
        if fact.old:
            fact.corrected_in = next(
                (t.text for t in turns if t.role == "user" and has(fact.value, t.text)), ""
            )


@dataclass
class Conversation:
    turns: list[Turn]
    facts: list[Fact]
    question: str
    # Turn id → the facts (subject, value) the conversation has established by that turn:
    # what a perfect summary of the turns up to it says.
    known_at: dict[int, dict[str, tuple[str, str]]]
    # Names, places, jobs and codes the user said of other people: never the user's.
    others: set[str] = field(default_factory=set)
    name: str = ""


TOPICS = [
    "how tides work",
    "the history of canals",
    "how to store fresh herbs",
    "why the sky is blue",
    "how vaccines are tested",
    "how bread rises",
    "how solar panels work",
    "what causes earthquakes",
    "how compound interest works",
    "how glaciers move",
    "how a bicycle gear works",
    "how coffee is roasted",
    "what a black hole is",
    "how bees make honey",
    "why leaves change colour",
    "how lighthouses work",
    "what inflation is",
    "how submarines dive",
]
SMALL_TALK = [
    "Our team meeting ran two hours over today.",
    "It's been raining all week here.",
    "I finally finished that crime novel last night.",
    "Long day. Glad it's Friday.",
    "The new season of the baking show started yesterday.",
    "I went for a run this morning and it felt great.",
]
REQUESTS = [
    "Suggest a relaxing hobby I could pick up.",
    "Give me three ideas for a quick dinner.",
    "Write a short haiku about autumn.",
    "List a few tips for sleeping better.",
    "Recommend a board game for four people.",
    "Draft a polite reply declining a meeting invite.",
]
OTHERS = [
    "My sister lives in {city} and works as {a_job}.",
    "My boss has a cat called {pet}.",
    "My neighbour {partner} is allergic to {allergy}.",
    "My brother just moved to {city}; his locker code at work is {code}, he told everyone.",
    "My friend {partner} works as {a_job} in {city}.",
]
# Replies about as long as a chat model's usual answer (100 to 150 tokens for an explanation),
# so the window holds a realistic number of exchanges.
REPLY = (
    "Good question. In short, {topic} comes down to a few simple ideas that build on each "
    "other. First there is the basic mechanism: what actually happens, step by step, and why "
    "it happens in that order rather than another. Then there are the conditions that change "
    "it: temperature, pressure, time, scale, or simply the people involved, depending on the "
    "case. Finally there are the exceptions that people notice in everyday life and that "
    "often cause the confusion in the first place.\n\nIf you tell me which part you care "
    "about most, I can go into it in more detail, give an example, or point you to a good "
    "introduction that explains it with pictures."
)
ACK = (
    "Thanks for sharing that. I'm here if you want to talk it through, or if there's "
    "anything I can help with around it, just say so."
)
DONE = (
    "Here you go, a few options to start with:\n\n1. The simplest one, which takes ten "
    "minutes and needs nothing special.\n2. A slightly more involved one that pays off if you "
    "do it regularly.\n3. Something different, in case neither of those suits you.\n\nEach "
    "is easy to try this week. Tell me which one you like and I can expand on it, adapt it to "
    "your situation, or suggest alternatives."
)


# What the fillers of the conversation being made said of other people (make_conversation
# collects it).
OTHERS_SAID: set[str] = set()


def _filler(rng: random.Random, avoid: set[str]) -> tuple[str, str]:
    kind = rng.choices(["question", "small", "request", "others", "mixed"], [3, 2, 2, 2, 2])[0]
    topic = rng.choice(TOPICS)
    if kind == "question":
        return f"Can you explain {topic}?", REPLY.format(topic=topic)
    if kind == "small":
        return rng.choice(SMALL_TALK), ACK
    if kind == "request":
        return rng.choice(REQUESTS), DONE
    pick = {
        "city": [c for c in CITIES if c not in avoid],
        "job": [j for j in JOBS if j not in avoid],
        "pet": [p for p in PETS if p not in avoid],
        "partner": [p for p in PARTNERS if p not in avoid],
        "allergy": [a for a in ALLERGIES if a not in avoid],
    }
    values = {
        "city": rng.choice(pick["city"]),
        "job": rng.choice(pick["job"]),
        "pet": rng.choice(pick["pet"]),
        "partner": rng.choice(pick["partner"]),
        "allergy": rng.choice(pick["allergy"]),
        "code": random_code(rng),
    }
    other = rng.choice(OTHERS).format(a_job=with_article(values["job"]), **values)
    OTHERS_SAID.update(v for v in values.values() if v in other)
    if kind == "others":
        return other, ACK
    return f"{other} Anyway, can you explain {topic}?", REPLY.format(topic=topic)


def make_conversation(rng: random.Random, *, exchanges: int) -> Conversation:
    """One conversation of `exchanges` question + answer pairs ending with the closing
    question; facts are planted in the first third, corrections in the second."""
    while True:  # five distinct subjects, one per placement
        subjects = rng.sample(list(SUBJECTS), k=len(PLACEMENTS))
        if all(p in SUBJECTS[s][2] for s, p in zip(subjects, PLACEMENTS, strict=True)):
            break
    facts, early, late = [], [], []
    avoid: set[str] = set()
    for subject, placement in zip(subjects, PLACEMENTS, strict=True):
        phrase, pool, _, asked, question = SUBJECTS[subject]
        values = rng.sample(pool, 2) if pool else [random_code(rng), random_code(rng)]
        value, old = values[0], values[1] if placement == "corrected" else ""
        avoid.update(v for v in (value, old) if v)
        fact = Fact(subject, placement, value, old, asked, question)
        facts.append(fact)
        said = phrase(rng, placement, value, old)
        if placement == "corrected":  # (fact, turns, value it establishes, value it replaces)
            early.append((fact, said[0], old, ""))
            late.append((fact, said[1], value, old))
        else:
            early.append((fact, said, value, ""))
    rng.shuffle(early)  # no placement always the oldest
    third = max(len(early) + 1, exchanges // 3)
    planted = dict(zip(sorted(rng.sample(range(third), len(early))), early, strict=True))
    late_range = range(third, third + max(len(late), third // 2))
    planted.update(zip(sorted(rng.sample(late_range, len(late))), late, strict=True))
    OTHERS_SAID.clear()
    turns: list[Turn] = []
    known: dict[str, tuple[str, str]] = {}
    known_at: dict[int, dict[str, tuple[str, str]]] = {}

    def add(role: str, text: str) -> None:
        turns.append(Turn(len(turns) + 1, role, text))
        known_at[len(turns)] = dict(known)

    for n in range(exchanges - 1):
        if n not in planted:
            user, reply = _filler(rng, avoid)
            add("user", user)
            add("assistant", reply)
            continue
        fact, pairs, value, former = planted[n]
        for i, (user, reply) in enumerate(pairs):
            if i == len(pairs) - 1:  # established once the user has said (or confirmed) it
                known[fact.subject] = (value, former)
            add("user", user)
            add("assistant", reply or ACK)
    asked = ", ".join(f.asked for f in facts[:-1]) + f" and {facts[-1].asked}"
    last = f"Before we finish, remind me: {asked}?"
    for fact in facts:  # the closing question must not give away what it asks for
        if fact.value.lower() in last.lower() or (fact.old and fact.old.lower() in last.lower()):
            raise ValueError(f"closing question names {fact.value!r}")
    add("user", last)
    with_corrections(turns, facts)
    return Conversation(
        turns=turns, facts=facts, question=last, known_at=known_at, others=set(OTHERS_SAID)
    )


def load_independent(paths: list[Path] = INDEPENDENT) -> list[Conversation]:
    """Written conversations (by default the frozen independent set), each ending with its
    closing question."""
    out = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            turns = [Turn(n, t["role"], t["text"]) for n, t in enumerate(row["turns"], 1)]
            turns.append(Turn(len(turns) + 1, "user", row["closing_question"]))
            facts = [
                Fact(
                    f["subject"],
                    f["placement"],
                    f["value"],
                    f.get("old", ""),
                    f["subject"],
                    f["question"],
                )
                for f in row["facts"]
            ]
            with_corrections(turns, facts)
            out.append(
                Conversation(
                    turns=turns,
                    facts=facts,
                    question=row["closing_question"],
                    known_at={},
                    others=set(row.get("others", [])),
                    name=row["id"],
                )
            )
    return out
