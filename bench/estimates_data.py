"""The workload of bench/estimates.py: answers whose lengths follow what people ask and how
each user writes, not the estimator's own log-linear form.

A question is short, medium or long by what it asks. Each class has two disjoint sets of
phrasings (cores, with a topic): LEARN, whose answers the estimators learn from, and NEVER,
phrasings no estimator ever learns from: they are predicted and scored, never taught (the
never-learned split, the headline). The openers and tails around a core are the same for every
class ("Hi, ", " Thanks."), so they say nothing of the answer's length. Users have habits: the
share of long questions they ask, and wordier or terser answers, in tokens added as well as in
proportion. The spread around the meant length is a gamma (not a log-normal); long answers run
to the cap a quarter of the time; some answers are refusals or clarifications whatever was
asked; background summaries sit just under their own cap.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

LEARN = {
    "short": [
        "What year did {} begin?",
        "Who founded {}?",
        "How old is {}?",
        "Is {} open on Sundays?",
        "What's the population of {}?",
        "Where is {} located?",
        "Is {} free to use?",
        "Who runs {} today?",
    ],
    "medium": [
        "What is {} used for?",
        "Why do people care about {}?",
        "What are the main benefits of {}?",
        "How is {} different from what came before it?",
        "What problems does {} run into?",
        "Give me an overview of {}.",
        "What should a beginner know about {}?",
        "Tell me about {}.",
    ],
    "long": [
        "Explain how {} works, step by step.",
        "Write an essay on the history of {}.",
        "Compare {} with its alternatives in detail, with a table.",
        "Write a complete tutorial on {} with examples.",
        "Describe every part of {} and how they fit together.",
        "Draft a report on {}: background, current state, risks and outlook.",
        "Teach me {} from scratch, covering everything a newcomer needs.",
        "List all the steps to set up {}, with commands and explanations.",
    ],
}
NEVER = {
    "short": [
        "Roughly how large is {}?",
        "Does {} still exist?",
        "Which country is {} in?",
        "Has {} ever changed its name?",
    ],
    "medium": [
        "What do critics say about {}?",
        "How did {} become popular?",
        "What's the fuss about {}?",
        "Sum up {} for me.",
    ],
    "long": [
        "Walk me through {} end to end, leaving nothing out.",
        "Give me a thorough rundown of {} for a presentation.",
        "Break down {} section by section with worked examples.",
        "I want an in-depth guide to {}, from the basics to advanced use.",
    ],
}
OPENERS = ["", "", "Hi, ", "Hello! ", "OK, ", "Question: "]
TAILS = ["", "", " Thanks.", " Thank you!", " Cheers."]
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
NEVER_SHARE = 0.3  # of people's questions: phrased from NEVER


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
    template: str  # which phrasing ("long/3", "never:short/1"; "summary" for background)
    never: bool = False  # phrased from NEVER: scored, never learned from


def question(rng: random.Random, size: str, topic: str, never: bool) -> tuple[str, str]:
    """A question of class `size`, and its template's name."""
    cores = (NEVER if never else LEARN)[size]
    core = rng.randrange(len(cores))
    text = rng.choice(OPENERS) + cores[core].format(topic) + rng.choice(TAILS)
    return text[0].upper() + text[1:], f"{'never:' if never else ''}{size}/{core}"


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
            yield Answer(kind, str(user), plan, prompt, 120, SUMMARY_ASK, real, 114, "summary")
            continue
        size = rng.choices(list(CLASS_TOKENS), shares)[0]
        never = rng.random() < NEVER_SHARE
        text, template = question(rng, size, rng.choice(TOPICS), never)
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
            text,
            max(1, min(max_tokens, round(real))),
            max(1, min(max_tokens, round(meant))),
            template,
            never,
        )
