"""Conversation memory: does a fact the user stated early survive into a late question's prompt?

    .venv/bin/python bench/memory.py                    # 50 conversations, SmolLM2 summaries
    .venv/bin/python bench/memory.py --conversations 10 # a quicker look

Generates long conversations (32 exchanges each, 64 turns) in which early questions state facts
(a name, a number, a preference, a place) among everyday questions, and whose last question
needs them all. Each conversation is replayed turn by turn through the prompt builder
(apps/chat/memory.plan_prompt, the code every chat message goes through): whenever it finds
turns falling out of the window it asks for a summary, and here the real model (SmolLM2-135M
through the worker's llama.cpp engine) writes it at once, as a background request would
between two questions. The last question's prompt is then built two ways at the same token
budget (the model's context minus the answer's share, as in production):

  (a) sliding window: the system prompt and the latest turns that fit;
  (b) memory: system prompt + summary + pinned/key-fact turns + the latest turns that fit.

A fact counts as kept when its value appears in the prompt text (the small model's answers are
too unreliable to grade, so the prompt is checked, not the answer). Figures are printed per
carrier, to be honest about what keeps facts: the model's summary text alone, the key-fact
lines (the user's statements, kept verbatim by a rule, not by the model), and the raw
recent turns. Token counts are the prompt builder's estimate (4 characters a token).

Last line: `memory: facts kept <a> % with summaries vs <b> % sliding window, prompt <t> tokens,
summary cost <s> tokens/turn` (summary cost: prompt + completion tokens of every summary
request, over all turns of all conversations).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")

import django  # noqa: E402

django.setup()

from apps.chat.prompt import memory  # noqa: E402
from apps.chat.prompt.prompting import BASE_SYSTEM_PROMPT  # noqa: E402
from apps.chat.selectors import PromptSources, Turn  # noqa: E402
from worker.engines import EngineRequest  # noqa: E402
from worker.engines.llamacpp import LlamaCppEngine  # noqa: E402

NAMES = [
    "Priya",
    "Tomasz",
    "Aiyana",
    "Kenji",
    "Oluwaseun",
    "Marisol",
    "Henrike",
    "Dmitri",
    "Farah",
    "Lachlan",
    "Ingrid",
    "Mateo",
    "Noor",
    "Bastian",
    "Yara",
    "Corentin",
]
CITIES = [
    "Valparaiso",
    "Tromso",
    "Nagoya",
    "Ljubljana",
    "Cork",
    "Tucson",
    "Gdansk",
    "Mombasa",
    "Tallinn",
    "Porto",
    "Leuven",
    "Hobart",
]
PREFERENCES = [
    ("tea", "coffee"),
    ("window seats", "aisle seats"),
    ("trains", "planes"),
    ("dark chocolate", "milk chocolate"),
    ("mornings", "evenings"),
    ("cats", "dogs"),
    ("short answers", "long answers"),
]
NUMBERS = [
    ("locker code", 4),
    ("booking reference", 6),
    ("flight number", 4),
    ("membership number", 5),
    ("room number", 3),
]
TOPICS = [
    "how tides work",
    "the history of canals",
    "how to store fresh herbs",
    "why the sky is blue",
    "how vaccines are tested",
    "what a sluice gate does",
    "how to stretch after running",
    "the rules of cricket",
    "how bread rises",
    "how solar panels work",
    "what causes earthquakes",
    "how to learn a language",
    "how compound interest works",
    "why cats purr",
    "how glaciers move",
    "the difference between weather and climate",
    "how a bicycle gear works",
    "how coffee is roasted",
    "what a black hole is",
    "how to keep basil alive",
    "how trains stay on the rails",
    "how bees make honey",
    "why leaves change colour",
    "how lighthouses work",
    "how to write a cover letter",
    "what inflation is",
    "how submarines dive",
    "how to fold a fitted sheet",
    "what a sonnet is",
    "how noise-cancelling headphones work",
    "how to plan a vegetable garden",
]
FILLER = (
    "It depends on a few things, and the short version is this: {topic} comes down to "
    "a handful of simple ideas that build on each other. First, the basic mechanism; "
    "then the conditions that change it; and finally the exceptions people notice in "
    "everyday life. Ask me about any of these if you want more detail."
)


@dataclass
class Fact:
    statement: str  # how the user says it
    value: str  # what must reach the prompt
    asked: str  # how the late question asks for it


@dataclass
class Conversation:
    turns: list[Turn]
    facts: list[Fact]
    question: str


@dataclass
class Tally:
    needed: int = 0
    window: int = 0
    memory: int = 0
    in_summary: int = 0
    in_key_lines: int = 0
    in_recent: int = 0
    prompt_tokens: list[int] = field(default_factory=list)
    window_tokens: list[int] = field(default_factory=list)
    summary_tokens: int = 0
    summary_calls: int = 0
    turns: int = 0


def make_conversation(rng: random.Random, *, exchanges: int) -> Conversation:
    name, city = rng.choice(NAMES), rng.choice(CITIES)
    liked, disliked = rng.choice(PREFERENCES)
    thing, digits = rng.choice(NUMBERS)
    number = "".join(rng.choice("0123456789") for _ in range(digits))
    # Several phrasings each, some without a first person or a fact word ("Honestly, tea beat
    # coffee"), so the figure is not just the rule matching its own generator. The filler turns
    # are questions only, though: real chats hold more statements competing for the budget.
    said = rng.choice(
        [f"My name is {name}.", f"I'm {name}, by the way.", f"Call me {name}.", f"Hi, {name} here."]
    )
    home = rng.choice(
        [f"I live in {city}.", f"We moved to {city} last year.", f"Home for me is {city}."]
    )
    likes = rng.choice(
        [
            f"I prefer {liked} over {disliked}.",
            f"I'd rather have {liked} than {disliked}.",
            f"Honestly, {liked} beat {disliked} every time.",
        ]
    )
    code = rng.choice(
        [
            f"My {thing} is {number}.",
            f"Note that my {thing} is {number}.",
            f"For the record, the {thing} is {number}.",
        ]
    )
    facts = [
        Fact(said, name, "what my name is"),
        Fact(home, city, "where I live"),
        Fact(likes, liked, f"whether I like {liked} or {disliked} better"),
        Fact(code, number, f"my {thing}"),
    ]
    topics = rng.sample(TOPICS, k=min(len(TOPICS), exchanges))
    # Facts come in the first few exchanges, each alongside an ordinary question.
    fact_at = sorted(rng.sample(range(0, 6), k=len(facts)))
    turns: list[Turn] = []
    next_id = 1
    for n in range(exchanges - 1):
        topic = topics[n % len(topics)]
        question = f"Can you explain {topic}?"
        if n in fact_at:
            question = f"{facts[fact_at.index(n)].statement} {question}"
        turns.append(Turn(next_id, "user", question))
        turns.append(Turn(next_id + 1, "assistant", FILLER.format(topic=topic)))
        next_id += 2
    asked = ", ".join(f.asked for f in facts[:-1]) + f" and {facts[-1].asked}"
    last = f"Before we finish, remind me: {asked}?"
    turns.append(Turn(next_id, "user", last))
    return Conversation(turns=turns, facts=facts, question=last)


def sliding_window(system: str, history: list[Turn], budget: int) -> str:
    """Sluice's prompt before memory: the latest turns that fit, nothing else."""
    kept, left = [], budget
    for turn in history:  # newest first
        cost = memory.estimate_tokens(turn.text)
        if cost > left:
            break
        left -= cost
        kept.append(turn.text)
    return "\n".join([system, *reversed(kept)])


class Summariser:
    def __init__(self, engine: LlamaCppEngine, max_tokens: int) -> None:
        self.engine, self.max_tokens = engine, max_tokens
        self.calls = 0

    async def __call__(self, messages: list[dict[str, str]]) -> tuple[str, int]:
        """The model's summary and the tokens it cost (prompt + completion)."""
        self.calls += 1
        request = EngineRequest(
            id=f"summary-{self.calls}",
            messages=messages,
            max_tokens=self.max_tokens,
            temperature=0.0,
        )
        text, used = [], 0
        async for out in self.engine.generate(request):
            text.append(out.text)
            used = out.prompt_tokens + out.completion_tokens
        return "".join(text), used


async def replay(
    conversation: Conversation, summarise: Summariser, budget: int, tally: Tally
) -> None:
    """Sends the conversation turn by turn: each question's prompt is planned as production
    plans it, and a summary that falls due is written before the next question."""
    summary, upto = "", 0
    turns = conversation.turns
    for end in range(1, len(turns) + 1):
        if turns[end - 1].role != "user":
            continue
        history = list(reversed(turns[:end]))
        sources = PromptSources(history=history, profile=None, summary=summary, summary_upto=upto)
        plan = memory.plan_prompt(system=BASE_SYSTEM_PROMPT, sources=sources, budget=budget)
        if end == len(turns):
            score(conversation, plan, summary, sources, budget, tally)
            return
        if plan.to_summarise:
            messages = memory.summary_messages(previous=summary, turns=plan.to_summarise)
            answer, used = await summarise(messages)
            tally.summary_tokens += used
            tally.summary_calls += 1
            summary = memory.summary_text(previous=summary, answer=answer)
            upto = plan.to_summarise[-1].id


def score(conversation, plan, summary, sources, budget, tally: Tally) -> None:
    full = "\n".join([plan.system, *(m["content"] for m in plan.turns)]).lower()
    window = sliding_window(BASE_SYSTEM_PROMPT, sources.history, budget).lower()
    recent = "\n".join(m["content"] for m in plan.turns[:-1]).lower()
    key_lines = "\n".join(plan.kept_facts).lower()
    for fact in conversation.facts:
        found = re.compile(rf"\b{re.escape(fact.value.lower())}\b").search
        tally.needed += 1
        tally.window += bool(found(window))
        tally.memory += bool(found(full))
        tally.in_summary += bool(found(summary.lower()))
        tally.in_key_lines += bool(found(key_lines))
        tally.in_recent += bool(found(recent))
    tally.prompt_tokens.append(
        memory.estimate_tokens(plan.system)
        + sum(memory.estimate_tokens(m["content"]) for m in plan.turns)
    )
    tally.window_tokens.append(memory.estimate_tokens(window))
    tally.turns += len(conversation.turns)


def pct(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 0.0


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=50)
    parser.add_argument("--exchanges", type=int, default=32, help="question + answer pairs")
    parser.add_argument("--context", type=int, default=2048, help="the model's context window")
    parser.add_argument(
        "--answer-tokens",
        type=int,
        default=512,
        help="the answer's share of the window (MODEL_MAX_TOKENS)",
    )
    parser.add_argument("--summary-tokens", type=int, default=memory.SUMMARY_MAX_TOKENS)
    parser.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: all)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    conversations = [
        make_conversation(rng, exchanges=args.exchanges) for _ in range(args.conversations)
    ]
    budget = args.context - args.answer_tokens - memory.estimate_tokens(BASE_SYSTEM_PROMPT)
    engine = LlamaCppEngine(
        slots=1, n_ctx=args.context, threads_per_slot=args.threads or None, seed=args.seed
    )
    await engine.start()
    tally = Tally()
    started = time.perf_counter()
    try:
        summarise = Summariser(engine, args.summary_tokens)
        for n, conversation in enumerate(conversations, 1):
            await replay(conversation, summarise, budget, tally)
            if n % 5 == 0 or n == len(conversations):
                print(
                    f"  {n}/{len(conversations)} conversations: facts kept "
                    f"{pct(tally.memory, tally.needed):.0f} % vs "
                    f"{pct(tally.window, tally.needed):.0f} %, in summary text "
                    f"{pct(tally.in_summary, tally.needed):.0f} %, {tally.summary_calls} "
                    f"summaries, {time.perf_counter() - started:.0f}s",
                    flush=True,
                )
    finally:
        await engine.stop()

    print(
        f"{len(conversations)} conversations of {args.exchanges} exchanges "
        f"({tally.turns // len(conversations)} turns), {tally.needed} needed facts, "
        f"budget {budget} tokens for turns (context {args.context}, answer "
        f"{args.answer_tokens}), model {engine.model_path.name}"
    )
    print(
        f"  sliding window:        {pct(tally.window, tally.needed):5.1f} % of facts in the "
        f"prompt, {statistics.mean(tally.window_tokens):.0f} tokens"
    )
    print(
        f"  summaries + key turns: {pct(tally.memory, tally.needed):5.1f} % of facts in the "
        f"prompt, {statistics.mean(tally.prompt_tokens):.0f} tokens"
    )
    print("  what carries them (a fact may be in several):")
    print(f"    the model's summary text   {pct(tally.in_summary, tally.needed):5.1f} %")
    print(f"    key-fact lines (verbatim)  {pct(tally.in_key_lines, tally.needed):5.1f} %")
    print(f"    recent turns (raw)         {pct(tally.in_recent, tally.needed):5.1f} %")
    per_turn = tally.summary_tokens / tally.turns if tally.turns else 0.0
    print(
        f"  {tally.summary_calls} summary requests, "
        f"{tally.summary_calls / len(conversations):.1f} per conversation, "
        f"{tally.summary_tokens} tokens, {time.perf_counter() - started:.0f}s"
    )
    print(
        f"memory: facts kept {pct(tally.memory, tally.needed):.0f} % with summaries vs "
        f"{pct(tally.window, tally.needed):.0f} % sliding window, prompt "
        f"{statistics.mean(tally.prompt_tokens):.0f} tokens, summary cost {per_turn:.0f} "
        "tokens/turn"
    )


if __name__ == "__main__":
    asyncio.run(main())
