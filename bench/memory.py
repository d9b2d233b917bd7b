"""Conversation memory: do facts the user gave early reach a late question's prompt, with their
current value?

    .venv/bin/python bench/memory.py                     # 8 conversations, SmolLM2 summaries
    .venv/bin/python bench/memory.py --conversations 50 --answers 5  # the fuller run
    .venv/bin/python bench/memory.py --max-minutes 30    # starts no conversation after 30 min
    .venv/bin/python bench/memory.py --set independent --summaries none --answers 0  # no model

The sets. `independent` (the headline): 40 conversations in bench/data/memory_independent_*.jsonl,
written in their own words by people who never read the memory's code or this bench, frozen
before the first run against them. Two sets to tune on: `dev`, conversations this bench
generates (bench/memory_data.py), and `tuning`, 156 written conversations in nine files,
bench/data/memory_tuning*.jsonl, by more writers who never read the memory's code. And
`heldout`, 156 more written conversations in bench/data/memory_heldout_*.jsonl by thirteen more
such writers (`_g`, 20; `_i`, `_l`, `_m`, `_n`, `_o`, `_p`, `_q`, `_r`, `_s`, `_t`, 12 each; `_u`
and `_v`, 8 each; `--heldout-files` picks some), frozen like the independent set and scored; the
misses of `_m` and `_n` were read while choices were worked on (docs/benchmarks.md, memory steps
14 and 15), those of `_o`, `_p`, `_q` and `_r` in step 16, some of `_s` and `_t` in step 19; of
`_u` and `_v` only their writers' one-line accounts of each conversation; the others' never.

The model's work is what takes time: about three summary requests per conversation, and for the
answers one long prompt per arm (an arm's questions share its prefix, so more `--answers` cost
little more). Each figure is printed with the number of facts it stands on; 8 conversations make
8 facts per placement, so read a placement's figure to within one or two facts.

Each conversation (bench/memory_data.py: 32 exchanges) plants five facts about the user, one per
placement: stated by the user, inside a user's question, named by the assistant and confirmed
by the user, stated and later corrected, implied in passing. Filler turns are statements, small
talk, requests, statements about other people and questions. The closing question asks for the
five facts without naming any of them.

Each conversation is replayed turn by turn through the prompt builder
(apps/chat/memory.plan_prompt, the code every chat message goes through); whenever it finds
turns falling out of the window it asks for a summary, which is written at once, as a
background request would between two questions. Three arms build the closing question's prompt
at the same token budget (the model's context minus the answer's share, as in production):

  window     the system prompt and the latest turns that fit (no memory);
  summaries  the pipeline with the demo model (SmolLM2-135M through the worker's llama.cpp
             engine) writing the summaries from production's summary request;
  ceiling    the same pipeline with a scripted engine whose summaries are perfect: every fact
             established in the turns so far, current value only ("formerly" for the old one).

Graded on the prompt: a fact counts when its current value is in it and, for a corrected fact,
the old value is not presented as current (in the summary or kept lines, a sentence naming it
without "formerly", "no longer"..., other than one quoted from the correction's own turn; in the
raw turns the correction follows it). Reported, not
targeted: the demo model's answer to a single question per sampled fact, built the same way.
Also printed: the share of summary sentences not grounded in the turns they summarise (a name,
number or most content words absent from those turns): what the summary invents.

Lines of the memory block that present what the user said of someone else as the user's are
counted, and listed with the turn they came from under "others shown as the user's:".

Last line: `memory: facts kept <s> % with summaries vs <w> % sliding window (ceiling <c> %);
by placement <user>/<question>/<assistant>/<corrected>/<implied> %` (placements: summaries arm).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")

import django  # noqa: E402

django.setup()

import memory_grade as grade  # noqa: E402
from memory_data import (  # noqa: E402
    HELDOUT,
    PLACEMENTS,
    TUNING,
    Conversation,
    Fact,
    load_independent,
    make_conversation,
)
from memory_grade import ARMS, Tally, pct, report  # noqa: E402

from apps.chat.prompt import memory, memory_facts, memory_reading, memory_summary  # noqa: E402
from apps.chat.prompt.prompting import BASE_SYSTEM_PROMPT  # noqa: E402
from apps.chat.selectors import PromptSources, Turn  # noqa: E402
from worker.engines import EngineRequest  # noqa: E402
from worker.engines.llamacpp import LlamaCppEngine  # noqa: E402

ANSWER_TOKENS = 40  # enough for a name, a city or a code


@dataclass
class Built:
    """One prompt: its messages, and the parts graded apart."""

    messages: list[dict[str, str]]
    memory_block: str  # the summary and kept lines: what sits before the turns
    summary: str
    key_lines: str  # the entries about the user (and quoted statements)
    recent: str
    others_lines: str = ""  # the entries about other people
    sources: PromptSources | None = None  # what the memory block was chosen from


def window_prompt(history: list[Turn], budget: int) -> Built:
    """Sluice's prompt before memory: the latest turns that fit, nothing else."""
    kept, left = [], budget
    for turn in history:  # newest first
        cost = memory.estimate_tokens(turn.text)
        if cost > left:
            break
        left -= cost
        kept.append(turn)
    turns = [{"role": t.role, "content": t.text} for t in reversed(kept)]
    recent = "\n".join(m["content"] for m in turns)
    return Built([{"role": "system", "content": BASE_SYSTEM_PROMPT}, *turns], "", "", "", recent)


def memory_prompt(
    history: list[Turn], summary: str, upto: int, budget: int, entries: list[dict]
) -> Built:
    sources = PromptSources(
        history=history, profile=None, summary=summary, summary_upto=upto, facts=entries
    )
    plan = memory.plan_prompt(system=BASE_SYSTEM_PROMPT, sources=sources, budget=budget)
    block = plan.remembered
    recent = "\n".join(m["content"] for m in plan.turns)
    messages = [{"role": "system", "content": plan.system}, *plan.turns]
    return Built(
        messages,
        block.text,
        "\n".join(block.summary),
        "\n".join(e.text() for e in block.facts),
        recent,
        "\n".join(e.text() for e in block.others),
        sources,
    )


def fold_entries(entries: list[dict], turns: list[Turn], before: list[Turn]) -> list[dict]:
    """The entries a summary's row keeps as of its last turn (memory_summary.summary_store)."""
    merged = memory_facts.merge(
        memory_facts.entries_from_json(entries),
        turns,
        newer=lambda a, b: a > b,
        before=before,
    )
    return memory_facts.entries_to_json(merged)


class ModelSummariser:
    """Production's summary request, answered by the demo model."""

    def __init__(self, engine: LlamaCppEngine) -> None:
        self.engine = engine
        self.calls = self.tokens = 0
        self.raw: list[tuple[str, str]] = []  # each answer as the model wrote it, with its turns

    async def __call__(self, conversation: Conversation, previous: str, turns: list[Turn]) -> str:
        self.calls += 1
        messages = memory_summary.summary_messages(previous=previous, turns=turns)
        request = EngineRequest(
            id=f"summary-{self.calls}",
            messages=messages,
            max_tokens=memory_summary.SUMMARY_MAX_TOKENS,
            temperature=0.0,  # as background requests are sent
        )
        text, used, finish = [], 0, ""
        async for out in self.engine.generate(request):
            text.append(out.text)
            used = out.prompt_tokens + out.completion_tokens
            finish = getattr(out, "finish_reason", "") or finish
        self.tokens += used
        self.raw.append(("".join(text), "\n".join(t.text for t in turns if t.role == "user")))
        said = "\n".join(t.text for t in turns if t.role == "user")
        return memory_summary.summary_text(
            previous=previous, answer="".join(text), finish_reason=finish, said=said
        )


class NoSummariser:
    """No summary at all: what the statements alone keep (a run without the model)."""

    calls = tokens = 0
    raw: list = []

    async def __call__(self, conversation: Conversation, previous: str, turns: list[Turn]) -> str:
        return previous


async def perfect_summary(conversation: Conversation, previous: str, turns: list[Turn]) -> str:
    """A scripted engine's summary: every fact the turns so far established, current values
    only, in the third person; what no model can beat."""
    known = conversation.known_at[turns[-1].id]
    lines = []
    for subject, (value, former) in known.items():
        line = PERFECT[subject].format(value)
        lines.append(f"{line[:-1]} (formerly {former})." if former else line)
    return "\n".join(lines) or previous


PERFECT = {
    "city": "The user lives in {}.",
    "job": "The user's job: {}.",
    "pet": "The user's cat is called {}.",
    "partner": "The user's partner is {}.",
    "allergy": "The user is allergic to {}.",
    "locker": "The user's gym locker code is {}.",
}


async def replay(conversation: Conversation, summarise, budget: int, on_summary=None):
    """Sends the conversation turn by turn: each question's prompt is planned as production
    plans it, and a summary that falls due is written before the next question, with the
    entries its row keeps. Returns the summary, its upto and those entries as they stand at
    the closing question."""
    summary, upto, entries = "", 0, []
    turns = conversation.turns
    for end in range(1, len(turns)):
        if turns[end - 1].role != "user":
            continue
        history = list(reversed(turns[:end]))
        sources = PromptSources(
            history=history, profile=None, summary=summary, summary_upto=upto, facts=entries
        )
        plan = memory.plan_prompt(system=BASE_SYSTEM_PROMPT, sources=sources, budget=budget)
        if plan.to_summarise:
            written = await summarise(conversation, summary, plan.to_summarise)
            first = turns.index(plan.to_summarise[0])
            entries = fold_entries(entries, plan.to_summarise, turns[:first])
            upto = plan.to_summarise[-1].id
            if on_summary and written != summary:  # the same notes kept are not new sentences
                on_summary(written, upto)
            summary = written
    return summary, upto, entries


def score(arm: str, fact: Fact, built: Built, tally: Tally) -> None:
    ok = grade.kept(fact, built.memory_block, built.recent)
    tally.kept[arm, fact.placement] += ok
    tally.old_current[arm] += grade.presents_old(fact, built.memory_block)
    tally.hedged[arm] += ok and grade.only_as_earlier(fact, built.memory_block, built.recent)
    tally.carriers[arm, "summary"] += grade.has(fact.value, built.summary)
    tally.carriers[arm, "key lines"] += grade.has(fact.value, built.key_lines)
    tally.carriers[arm, "recent turns"] += grade.has(fact.value, built.recent)


def tally_lost(c: Conversation, built: Built, tally: Tally) -> None:
    """Why each fact the prompt lacks was lost: its old value shown as current, a statement
    holding its value read and left out by the block's budget, or none read."""
    said = None
    for fact in c.facts:
        if grade.kept(fact, built.memory_block, built.recent):
            continue
        if said is None:
            said = [e.text() for e in memory.entries_for(built.sources) if e.value]
        if grade.presents_old(fact, built.memory_block):
            why = "old shown"
        elif any(grade.has(fact.value, line) for line in said):
            why = "left out"
        else:
            why = "not read"
        tally.lost[fact.placement, why] += 1


async def ask(engine: LlamaCppEngine, built: Built, n: int) -> str:
    request = EngineRequest(
        id=f"answer-{n}", messages=built.messages, max_tokens=ANSWER_TOKENS, temperature=0.0
    )
    return "".join([out.text async for out in engine.generate(request)])


def with_question(turns: list[Turn], text: str) -> list[Turn]:
    """The history (newest first) with its closing question replaced by `text`."""
    last = turns[-1]
    return [Turn(last.id, last.role, text), *reversed(turns[:-1])]


async def run_conversation(c: Conversation, engine, summariser, rng, args, tally: Tally):
    budget = args.budget
    history = list(reversed(c.turns))
    source = [t.text for t in c.turns]
    summaries: dict[str, tuple[str, int, list]] = {}

    def check(summary: str, upto: int) -> None:
        covered = grade.source_index(source[:upto])
        for sentence in grade.sentences(summary):
            tally.sentences += 1
            if not grade.grounded(sentence, covered):
                tally.invented += 1
                if len(tally.examples) < 4:
                    tally.examples.append(sentence)

    def check_perfect(summary: str, upto: int) -> None:
        covered = grade.source_index(source[:upto])
        for sentence in grade.sentences(summary):
            tally.perfect_sentences += 1
            tally.perfect_flagged += not grade.grounded(sentence, covered)

    summaries["summaries"] = await replay(c, summariser, budget, on_summary=check)
    if "ceiling" in tally.arms:
        summaries["ceiling"] = await replay(c, perfect_summary, budget, on_summary=check_perfect)

    def build(arm: str, turns: list[Turn]) -> Built:
        if arm == "window":
            return window_prompt(turns, budget)
        return memory_prompt(turns, *summaries[arm][:2], budget, summaries[arm][2])

    # What building the closing prompt costs the web: cold (no statement embedded yet in this
    # process, as after a restart) and then warm (each statement embedded once per process).
    for cache in ("cold", "warm"):
        if cache == "cold":
            memory_reading.vectors_forget()
            memory_facts.statements_forget()
        started = time.perf_counter()
        build("summaries", history)
        tally.prompt_ms[cache].append(1000 * (time.perf_counter() - started))
    for arm in tally.arms:
        built = build(arm, history)
        tally.prompt_tokens[arm] += sum(
            memory.estimate_tokens(m["content"]) for m in built.messages
        )
        for fact in c.facts:
            score(arm, fact, built, tally)
        lines = [*built.summary.splitlines(), *built.key_lines.splitlines()]
        for line, said in grade.others_as_user(c, lines):
            tally.others_as_user[arm] += 1
            tally.others_shown.append(f"{arm}: {line!r} <- {said!r}")
        if arm == "summaries":
            tally_lost(c, built, tally)
            tally.others_lines += len(built.others_lines.splitlines())
            words = built.key_lines.splitlines()
            tally.words_lines += len(words)
            tally.earlier_lines += sum(line.startswith("Earlier") for line in words)
            for sentence in grade.instruction_lines(built.memory_block):
                tally.instruction_lines.append(sentence)
            for fact in c.facts:
                if grade.presents_old(fact, built.memory_block):
                    tally.stale_shown.append(
                        f"{c.name or '?'}: {fact.old!r} in {built.key_lines!r}"[:300]
                    )
            if tally.dump is not None:
                tally.dump.append(
                    {
                        "conversation": c.name,
                        "block": built.memory_block,
                        "facts": [
                            {
                                "placement": f.placement,
                                "value": f.value,
                                "old": f.old,
                                "kept": grade.kept(f, built.memory_block, built.recent),
                                "old_shown": grade.presents_old(f, built.memory_block),
                            }
                            for f in c.facts
                        ],
                    }
                )
        if arm == "summaries":  # what of the summary reached the closing prompt
            covered = grade.source_index(source[: summaries[arm][1]])
            for sentence in grade.sentences(built.summary):
                tally.final_sentences += 1
                tally.final_invented += not grade.grounded(sentence, covered)
    for fact in c.facts:
        tally.needed[fact.placement] += 1
    sampled = rng.sample(c.facts, k=min(args.answers, len(c.facts)))
    for arm in [a for a in args.answer_arms if a in tally.arms]:  # sharing the prompt's prefix
        for fact in sampled:
            built = build(arm, with_question(c.turns, fact.question))
            reply = await ask(engine, built, tally.asked[arm])
            tally.asked[arm] += 1
            tally.answered[arm] += grade.answered(fact, reply)


def chosen_files(parser, kind: str, paths: list[Path], args) -> list[Path]:
    """The files of a set that --tuning-files or --heldout-files names (all when none)."""
    chosen = {n.strip() for n in getattr(args, f"{kind}_files").split(",") if n.strip()}
    unknown = chosen - {path.name for path in paths}
    if unknown:
        parser.error(f"--{kind}-files: no {', '.join(sorted(unknown))} in bench/data/")
    return [p for p in paths if not chosen or p.name in chosen]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--exchanges", type=int, default=32, help="question + answer pairs")
    parser.add_argument("--context", type=int, default=2048, help="the model's context window")
    parser.add_argument(
        "--answer-tokens", type=int, default=512, help="the answer's share (MODEL_MAX_TOKENS)"
    )
    parser.add_argument(
        "--answers", type=int, default=2, help="facts per conversation asked of the demo model"
    )
    parser.add_argument(
        "--answer-arms", default="window,summaries,ceiling", help="arms whose prompts it answers"
    )
    parser.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: all)")
    parser.add_argument(
        "--max-minutes", type=float, default=0, help="start no conversation after this (0: none)"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--set",
        choices=("independent", "heldout", "dev", "tuning", "both", "all"),
        default="both",
        help="both: independent and dev; all: the four",
    )
    parser.add_argument(
        "--conversations-independent", type=int, default=0, help="the first N (0: all 40)"
    )
    parser.add_argument(
        "--tuning-files",
        default="",
        help="with --set tuning: only these files of bench/data/, comma-separated "
        "(memory_tuning_e.jsonl); all of them by default",
    )
    parser.add_argument(
        "--heldout-files",
        default="",
        help="with --set heldout: only these files of bench/data/, comma-separated "
        "(memory_heldout_g.jsonl); all of them by default",
    )
    parser.add_argument(
        "--summaries",
        choices=("model", "none"),
        default="model",
        help="none: no summary requests (what the statements alone keep; no model needed)",
    )
    parser.add_argument("--dump", default="", help="write each closing memory block to this path")
    args = parser.parse_args()
    args.answer_arms = [a for a in args.answer_arms.split(",") if a in ARMS]
    args.budget = args.context - args.answer_tokens - memory.estimate_tokens(BASE_SYSTEM_PROMPT)

    rng = random.Random(args.seed)
    sets = {}
    if args.set in ("independent", "both", "all"):
        sets["independent"] = load_independent()
        if args.conversations_independent:
            sets["independent"] = sets["independent"][: args.conversations_independent]
    if args.set in ("heldout", "all"):
        sets["heldout"] = load_independent(chosen_files(parser, "heldout", HELDOUT, args))
    if args.set in ("tuning", "all"):
        sets["tuning"] = load_independent(chosen_files(parser, "tuning", TUNING, args))
    if args.set in ("dev", "both", "all"):
        sets["dev"] = [
            make_conversation(rng, exchanges=args.exchanges) for _ in range(args.conversations)
        ]
    engine = None
    if args.summaries == "model" or args.answers:
        engine = LlamaCppEngine(
            slots=1, n_ctx=args.context, threads_per_slot=args.threads or None, seed=args.seed
        )
        await engine.start()
    started = time.perf_counter()
    lines = {}
    try:
        for name, conversations in sets.items():
            arms = ARMS if name == "dev" else ("window", "summaries")
            tally = Tally(arms=arms, dump=[] if args.dump else None)
            summariser = ModelSummariser(engine) if args.summaries == "model" else NoSummariser()
            print(f"[{name}] {len(conversations)} conversations", flush=True)
            for n, conversation in enumerate(conversations, 1):
                if args.max_minutes and time.perf_counter() - started > 60 * args.max_minutes:
                    print(f"  time limit: stopped after {n - 1} conversations", flush=True)
                    conversations = conversations[: n - 1]
                    break
                await run_conversation(conversation, engine, summariser, rng, args, tally)
                total = sum(tally.needed.values())
                kept = sum(tally.kept["summaries", p] for p in PLACEMENTS)
                print(
                    f"  {n}/{len(conversations)}: kept {pct(kept, total):.0f} % with summaries, "
                    f"{summariser.calls} summaries, {time.perf_counter() - started:.0f}s",
                    flush=True,
                )
            tally.summary_calls, tally.summary_tokens = summariser.calls, summariser.tokens
            tally.raw_sentences = sum(len(grade.sentences(text)) for text, _ in summariser.raw)
            print(f"[{name}]")
            exchanges = len(conversations[0].turns) // 2 if conversations else 0
            lines[name] = report(
                tally, args, len(conversations), time.perf_counter() - started, exchanges
            )
            if args.dump:
                Path(args.dump).with_suffix(f".{name}.json").write_text(
                    json.dumps(tally.dump, indent=1)
                )
    finally:
        if engine is not None:
            await engine.stop()
    # The headline last: it is the line bench/record.py files.
    for name in sorted(lines, key=lambda name: name == "independent"):
        print(f"memory ({name}{', headline' if name == 'independent' else ''}): {lines[name]}")


if __name__ == "__main__":
    asyncio.run(main())
