"""The workload of bench/estimates.py: answers whose lengths follow what people ask and how
each user writes, not the estimator's own log-linear form.

A question is short, medium or long by what it asks; half the questions of each class use
phrasings the estimator's keyword lists were written for (SEEN), half use phrasings held apart
from them (HELD: none of their words is in those lists). Users have habits: the share of long
questions they ask, and wordier or terser answers, in tokens added as well as in proportion.
The spread around the meant length is a gamma (not a log-normal); long answers run to the cap
a quarter of the time; some answers are refusals or clarifications whatever was asked;
background summaries sit just under their own cap.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SEEN = {
    "short": [
        "What is the capital of {}?",
        "Who wrote {}?",
        "When was {} founded?",
        "How many people live in {}?",
        "Is {} true, yes or no?",
        "Define {}.",
    ],
    "medium": ["What is {} used for?", "Why does {} matter?", "Which problems does {} solve?"],
    "long": [
        "Explain how {} works, step by step.",
        "Write a short essay about {}.",
        "Compare {} with its alternatives in detail.",
        "List the steps to set up {}.",
        "Describe the history of {} and why it matters.",
    ],
}
# Held-apart phrasings are put together from an opener, a core and a tail, so that they come
# in hundreds of forms, as people's do, rather than a few templates a learner could memorise.
HELD = {
    "short": (
        ["", "Quick one: ", "Just curious, ", "Real quick: "],
        [
            "{} population these days?",
            "year {} started?",
            "is {} older than the internet?",
            "is {} a real thing?",
            "roughly how big is {}?",
            "{}: good or bad?",
            "is {} still around?",
        ],
        ["", " Just the number.", " Short answer please.", " One line is fine."],
    ),
    "medium": (
        ["", "Hey, ", "So, "],
        [
            "tell me a bit about {}.",
            "what are the pros and cons of {}?",
            "I keep hearing about {}; what's the fuss?",
            "give me the gist of {}.",
            "what do people like about {}?",
            "sum up {} for me.",
        ],
        ["", " A paragraph or two is plenty.", " Keep it readable."],
    ),
    "long": (
        ["", "I have time, so ", "For my course, ", "Please "],
        [
            "walk me through setting up {} from scratch.",
            "teach me {} as if I were new to it, covering everything.",
            "I need a thorough rundown of {} for a presentation tomorrow.",
            "give me the complete picture of {}: background, how it works today, and what "
            "comes next.",
            "go deep on {}; I want all the nuance.",
            "break down {} section by section with examples.",
        ],
        ["", " Be thorough.", " Include examples and pitfalls.", " Don't skip anything."],
    ),
}


def held_question(rng: random.Random, size: str, topic: str) -> tuple[str, bool]:
    """A held-apart question, and whether its core is the class's last one: the core the
    bench never lets a learner learn from, to see how far the learned words carry."""
    openers, cores, tails = HELD[size]
    core = rng.randrange(len(cores))
    text = rng.choice(openers) + cores[core].format(topic) + rng.choice(tails)
    return text[0].upper() + text[1:], core == len(cores) - 1


TOPICS = [
    "France",
    "Redis",
    "photosynthesis",
    "the printing press",
    "Kubernetes",
    "Lisbon",
    "vector search",
    "the Roman empire",
    "TCP",
    "sourdough bread",
    "the European Union",
    "quantum computing",
    "jazz",
]
# What a background summary's last user message ends with (its instruction).
SUMMARY_ASK = (
    "Rewrite the notes: one short line per fact the user stated about themselves "
    "(name, numbers, places, preferences), copied exactly, then one line listing "
    "the topics they asked about."
)
CLASS_TOKENS = {"short": 35, "medium": 140, "long": 380}


@dataclass
class Answer:
    kind: str
    user: str
    plan: str
    prompt: int  # prompt tokens
    max_tokens: int
    question: str
    real: int  # the answer's tokens
    meant: int  # its length before the random spread, caps and refusals: the oracle
    held_out: bool  # a phrasing held apart from the keyword lists
    novel: bool = False  # one whose core the learners never learn from (a test set)


def workload(answers: int, users: int, seed: int):
    rng = random.Random(seed)
    habits = {}
    for u in range(users):
        long_share = rng.choice([0.05, 0.15, 0.3, 0.6, 0.85])
        short_share = (1 - long_share) * rng.choice([0.4, 0.7])
        habits[u] = (
            (short_share, 1 - long_share - short_share, long_share),
            rng.choice([0.6, 0.8, 1.0, 1.0, 1.25, 1.6]),  # wordier or terser, in proportion
            rng.choice([0, 0, 0, 25, 60]),  # and in tokens added (greetings, caveats)
        )
    for _ in range(answers):
        user = min(users - 1, int(rng.paretovariate(1.2)) - 1)  # a few users send most
        plan = "pro" if user % 5 == 0 else "free"
        max_tokens = 1024 if plan == "pro" else 512
        shares, scale, extra = habits[user]
        kind = rng.choices(["chat", "rag", "long", "background"], [55, 30, 5, 10])[0]
        prompt = {"chat": 120, "rag": 900, "long": 2500, "background": 1400}[kind]
        prompt = int(prompt * rng.uniform(0.6, 1.6))
        if kind == "background":
            real = max(20, round(120 - rng.expovariate(1 / 12)))
            yield Answer(kind, str(user), plan, prompt, 120, SUMMARY_ASK, real, 114, False)
            continue
        size = rng.choices(list(CLASS_TOKENS), shares)[0]
        held = rng.random() < 0.5
        topic = rng.choice(TOPICS)
        question, novel = rng.choice(SEEN[size]).format(topic), False
        if held:
            question, novel = held_question(rng, size, topic)
        meant = CLASS_TOKENS[size] * {"chat": 1.0, "rag": 1.25, "long": 1.4}[kind]
        meant = meant * scale + extra + (15 if kind == "rag" else 0)
        if rng.random() < 0.08:  # a refusal or a clarifying question, whatever was asked
            real = rng.uniform(12, 40)
        elif size == "long" and rng.random() < 0.25:  # ran on to the cap
            real = max_tokens
        else:
            real = meant * rng.gammavariate(6, 1 / 6)
        yield Answer(
            kind,
            str(user),
            plan,
            prompt,
            max_tokens,
            question,
            max(1, min(max_tokens, round(real))),
            max(1, min(max_tokens, round(meant))),
            held,
            novel,
        )
