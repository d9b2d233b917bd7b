"""Memory written by a model (apps/chat/prompt/memory_writer.py) against the model-free reading,
side by side on the same written conversations, graded as bench/memory.py grades them.

For each user turn the model is asked what the background `memory` task asks (the same
messages and JSON schema); its quotes are checked against the turn as the product checks them,
and the closing prompt is planned by the product's own code with those NOTED entries, as a
conversation whose every turn was noted. No summaries: this measures what the statements
keep. The figure is what MemoryWriter.accuracy holds for the model.

    .venv/bin/python bench/memory_writer.py --set tuning              # the demo model, in-process
    .venv/bin/python bench/memory_writer.py --set independent --base-url http://host/v1 \\
        --model NAME --api-key KEY                                  # any OpenAI-compatible model
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")

import django  # noqa: E402

django.setup()

import memory_grade as grade  # noqa: E402
from memory import memory_prompt  # noqa: E402
from memory_data import PLACEMENTS, TUNING, load_independent  # noqa: E402

from apps.chat.prompt import memory_facts, memory_writer  # noqa: E402
from apps.chat.prompt.memory import estimate_tokens  # noqa: E402
from apps.chat.prompt.prompting import BASE_SYSTEM_PROMPT  # noqa: E402
from apps.chat.selectors import Turn  # noqa: E402
from worker.engines import EngineRequest  # noqa: E402

ARMS = ("rules", "model")


class InProcess:
    """The demo model through the worker's own llama.cpp engine (its grammar for the schema)."""

    def __init__(self, threads: int) -> None:
        from worker.engines.llamacpp import LlamaCppEngine

        self.engine = LlamaCppEngine(slots=1, n_ctx=2048, threads_per_slot=threads or None)
        self.name = "SmolLM2-135M-Instruct (llama.cpp, in-process)"

    async def start(self) -> None:
        await self.engine.start()

    async def __call__(self, messages: list[dict], n: int) -> str:
        request = EngineRequest(
            id=f"note-{n}",
            messages=messages,
            max_tokens=memory_writer.WRITER_MAX_TOKENS,
            temperature=0.0,
            response_format=memory_writer.RESPONSE_FORMAT,
        )
        return "".join([out.text async for out in self.engine.generate(request)])


class Remote:
    """Any OpenAI-compatible endpoint (Sluice's own /v1 too), with the same response_format."""

    def __init__(self, base_url: str, model: str, api_key: str) -> None:
        import openai

        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "none")
        self.model, self.name = model, f"{model} at {base_url}"

    async def start(self) -> None:
        pass

    async def __call__(self, messages: list[dict], n: int) -> str:
        reply = await self.client.chat.completions.create(
            model=self.model,
            messages=messages,
            max_tokens=memory_writer.WRITER_MAX_TOKENS,
            temperature=0.0,
            response_format=memory_writer.RESPONSE_FORMAT,
        )
        return reply.choices[0].message.content or ""


async def noted_entries(conversation, ask, counts: dict) -> list[dict]:
    """Every user turn but the closing question, noted by the model."""
    entries, previous = [], ""
    for turn in conversation.turns[:-1]:
        if turn.role != "user":
            previous = turn.text
            continue
        messages = memory_writer.writer_messages(user_text=turn.text, assistant_text=previous)
        answer = await ask(messages, counts["asked"])
        counts["asked"] += 1
        try:
            asked = json.loads(answer).get("facts", [])
        except (ValueError, AttributeError):
            asked = None
        noted = memory_writer.noted_from_answer(
            answer, user_text=turn.text, assistant_text=previous, at=turn.id
        )
        if noted is None or asked is None:
            counts["unreadable"] += 1
            noted = []
        else:
            counts["quotes"] += len(asked)
            counts["kept_quotes"] += sum(1 for e in noted if e.value)
        entries += memory_facts.entries_to_json(noted)
        previous = ""
    return entries


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=("independent", "tuning"), default="tuning")
    parser.add_argument("--conversations", type=int, default=0, help="the first N (0: all)")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--answer-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--base-url", default="", help="an OpenAI-compatible endpoint")
    parser.add_argument("--model", default="")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", ""))
    parser.add_argument(
        "--record",
        metavar="MODEL",
        help="store the figures on MODEL's MemoryWriter row (the service's DATABASE_URL; the "
        "admin's Operations page shows them)",
    )
    args = parser.parse_args()
    conversations = load_independent() if args.set == "independent" else load_independent(TUNING)
    if args.conversations:
        conversations = conversations[: args.conversations]
    ask = (
        Remote(args.base_url, args.model, args.api_key)
        if args.base_url
        else InProcess(args.threads)
    )
    await ask.start()
    # As bench/memory.py plans it.
    budget = args.context - args.answer_tokens - estimate_tokens(BASE_SYSTEM_PROMPT)
    kept = {(arm, p): 0 for arm in ARMS for p in PLACEMENTS}
    needed = dict.fromkeys(PLACEMENTS, 0)
    stale = dict.fromkeys(ARMS, 0)
    others = dict.fromkeys(ARMS, 0)
    counts = {"asked": 0, "unreadable": 0, "quotes": 0, "kept_quotes": 0}
    started = time.perf_counter()
    for index, c in enumerate(conversations, 1):
        noted = await noted_entries(c, ask, counts)
        history: list[Turn] = list(reversed(c.turns))
        for arm, entries in (("rules", []), ("model", noted)):
            built = memory_prompt(history, "", 0, budget, entries)
            for fact in c.facts:
                kept[arm, fact.placement] += grade.kept(fact, built.memory_block, built.recent)
                stale[arm] += grade.presents_old(fact, built.memory_block)
            lines = built.key_lines.splitlines()
            others[arm] += len(grade.others_as_user(c, lines))
        for fact in c.facts:
            needed[fact.placement] += 1
        print(f"  {index}/{len(conversations)} {c.name}: {time.perf_counter() - started:.0f}s")
    total = sum(needed.values())
    print(f"[{args.set}] {len(conversations)} conversations, writer: {ask.name}")
    print(
        f"  {'arm':6} {'kept':>6}  " + " ".join(f"{p:>9}" for p in PLACEMENTS) + "  stale  others"
    )
    figures = {}
    for arm in ARMS:
        share = sum(kept[arm, p] for p in PLACEMENTS) / total
        by = [kept[arm, p] / needed[p] if needed[p] else 0.0 for p in PLACEMENTS]
        figures[arm] = (share, by)
        print(
            f"  {arm:6} {share:6.1%}  "
            + " ".join(f"{b:9.0%}" for b in by)
            + f"  {stale[arm]:5}  {others[arm]:6}"
        )
    print(
        f"  {counts['asked']} turns asked; {counts['unreadable']} answers not the JSON asked for; "
        f"{counts['kept_quotes']} of {counts['quotes']} quotes found in the turn they quote"
    )
    print(
        f"memory writer ({args.set}): {figures['model'][0]:.0%} kept with the model writing vs "
        f"{figures['rules'][0]:.0%} model-free; stale {stale['model']} vs {stale['rules']}; "
        f"by placement {'/'.join(f'{b:.0%}' for b in figures['model'][1])}"
    )
    if args.record is not None:
        record(args, figures["model"][0], stale["model"], ask.name, len(conversations))


def record(args, accuracy: float, stale: int, writer: str, conversations: int) -> None:
    from django.utils import timezone

    from apps.chat.models import MemoryWriter

    command = f"bench/memory_writer.py --set {args.set} ({conversations} conversations; {writer})"
    MemoryWriter.objects.update_or_create(
        model=args.record,
        defaults={
            "accuracy": round(accuracy, 3),
            "stale_shown": stale,
            "measured_with": command[:300],
            "measured_at": timezone.now(),
        },
    )
    print(f"recorded on the MemoryWriter row of {args.record or '(default model)'}")


if __name__ == "__main__":
    asyncio.run(main())
