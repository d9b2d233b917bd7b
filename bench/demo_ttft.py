"""Time to first token on `make run`'s demo: the real SmolLM2 llama.cpp worker, the whole stack.

    .venv/bin/python bench/demo_ttft.py               # 20 questions a phase
    .venv/bin/python bench/demo_ttft.py --questions 24 --max-tokens 64

Starts what `make run` starts (embedded PostgreSQL and Redis under $SLUICE_VAR_DIR/demo-ttft,
migrations, the demo corpus ingested from docs/ and its relevance gate calibrated, then web,
dispatcher and a llama.cpp worker with make run's options), signs in one user, and asks over
the chat websocket, one question at a time, as a person would:

1. first: a general question in a new conversation (the demo corpus has nothing on it, so the
   gate lets no passage through);
2. follow-up: a second question in each of those conversations (affinity sends it to the same
   worker, whose KV cache holds the first turn: only the new tokens are read);
3. with passages: a question about Sluice in a new conversation (passages from docs/).

Time to first token is from sending the question to the first text on the socket. Beside it,
per phase: the model's own time to first token inside the worker (from the final event), the
prompt tokens and how many were read (not found in the KV cache), and, once the stack has
stopped, the engine alone (the same prompts, rebuilt with the web's own prompt code, on a
LlamaCppEngine with the same options in this process) so a busy machine can be told from a slow
path. Answers are capped at --max-tokens (time to first token does not depend on it; a follow-up
then repeats a shorter first answer than the default cap would give).

Prints figures; asserts nothing. The last line: `demo: first <a> s, follow-up <b> s, with
passages <c> s` (medians).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from devstack.stack import (  # noqa: E402
    VAR_DIR,
    Supervisor,
    app_processes,
    backing_services,
    free_port,
    manage,
    say,
)

FIRST = [
    "What is the capital of France?",
    "Who painted the Mona Lisa?",
    "How many continents are there?",
    "What is the largest ocean on Earth?",
    "Why is the sky blue?",
    "What do bees make?",
    "How many days are in a leap year?",
    "What is the chemical symbol for gold?",
    "Who was the first person on the Moon?",
    "What language is spoken in Brazil?",
    "How many strings does a violin have?",
    "What is the tallest animal?",
    "Which planet is called the red planet?",
    "What is the freezing point of water in Fahrenheit?",
    "Who invented the telephone?",
    "What is the main ingredient of guacamole?",
    "How many players are on a soccer team?",
    "What is the largest desert in the world?",
    "Which metal is liquid at room temperature?",
    "What is the square root of 81?",
    "Who wrote Romeo and Juliet?",
    "What is the longest river in Africa?",
    "How many hours are in a week?",
    "What gas do plants take in?",
]
FOLLOW_UP = [
    "Can you say that in one sentence?",
    "Why is that?",
    "Tell me one more fact about it.",
    "How do you know?",
    "Can you explain it to a child?",
    "Is that always true?",
    "What is a common mistake about this?",
    "Give me an example.",
]
# On top of the calibration questions (bench/sluice_docs_questions.jsonl): more about Sluice.
MORE_ON_TOPIC = [
    "How does Sluice stream tokens to the browser?",
    "What is the request inspector?",
    "How do I run Sluice with a GPU?",
    "What does the dispatcher do when a worker dies?",
    "How does Sluice limit how fast a user can send requests?",
    "Which metrics does Sluice export to Prometheus?",
    "How do I ingest Markdown files into a corpus?",
    "What is the OpenAI-compatible API of Sluice?",
]


@dataclass
class Asked:
    phase: str
    question: str
    conversation_id: int
    ttft: float = float("nan")  # seconds, on the socket
    engine_ttft: float = float("nan")  # seconds, inside the worker
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of them, found in the worker's KV cache
    passages: int = 0
    direct_ttft: float = float("nan")  # seconds, the engine alone, same prompt
    direct_prompt: tuple[int, int] = (0, 0)  # (prompt tokens, of them cached)
    error: str = ""


@dataclass
class Phases:
    asked: list[Asked] = field(default_factory=list)
    worker_cache: tuple[int, int] = (0, 0)

    def of(self, phase: str) -> list[Asked]:
        return [a for a in self.asked if a.phase == phase and not a.error]


def on_topic_questions(count: int) -> list[str]:
    path = BASE_DIR / "bench" / "sluice_docs_questions.jsonl"
    questions = [json.loads(line)["question"] for line in path.read_text().splitlines() if line]
    return (questions + MORE_ON_TOPIC)[:count]


def prepare(count: int):
    """One signed-in user with rate limits out of the way; its session cookie and the user."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")
    import django

    django.setup()
    from django.test import Client

    from apps.accounts.services import user_create
    from apps.admission.models import Plan

    Plan.objects.filter(is_default=True).update(
        requests_per_minute=1_000_000,
        burst_requests=1_000_000,
        tokens_per_minute=10**9,
        burst_tokens=10**9,
        tokens_per_day=10**9,
        max_concurrent=10_000,
    )
    user = user_create(username=f"ttft{os.getpid()}", password="bench-password-1")
    client = Client()
    client.force_login(user)
    return user, client.cookies["sessionid"].value


def new_conversation(user) -> int:
    from apps.chat.services import conversation_create

    return conversation_create(owner=user, title="demo ttft").id


async def ask(ws_base: str, cookie: str, asked: Asked) -> None:
    import websockets

    url = f"{ws_base}/ws/chat/{asked.conversation_id}/"
    origin = ws_base.replace("ws://", "http://")
    headers = {"Origin": origin, "Cookie": f"sessionid={cookie}"}
    async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
        sent = time.perf_counter()
        await ws.send(json.dumps({"type": "send", "text": asked.question}))
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), timeout=600))
            kind = frame["type"]
            if kind == "status" and "citations" in frame:
                asked.passages = len(frame["citations"])
            elif kind == "delta" and asked.ttft != asked.ttft:  # the first text
                asked.ttft = time.perf_counter() - sent
            elif kind == "error":
                asked.error = frame.get("message", "error")
                return
            elif kind == "final":
                usage = frame.get("usage") or {}
                asked.prompt_tokens = usage.get("prompt_tokens") or 0
                asked.cached_tokens = usage.get("cached_tokens") or 0
                if usage.get("ttft_ms") is not None:
                    asked.engine_ttft = usage["ttft_ms"] / 1000
                if frame["state"] != "done":
                    asked.error = frame.get("error") or frame["state"]
                return


async def wait_until_free(user, conversation_id: int) -> None:
    """The answer is recorded (the next question in the conversation is accepted at once)."""
    from asgiref.sync import sync_to_async

    from apps.chat.models import Message

    def recorded() -> bool:
        return Message.objects.filter(conversation_id=conversation_id, role="assistant").exists()

    for _ in range(200):
        if await sync_to_async(recorded)():
            return
        await asyncio.sleep(0.05)


async def run_phases(ws_base: str, cookie: str, user, count: int) -> Phases:
    from asgiref.sync import sync_to_async

    phases = Phases()
    create = sync_to_async(new_conversation)
    for n, question in enumerate(FIRST[:count]):
        first = Asked("first", question, await create(user))
        await ask(ws_base, cookie, first)
        await wait_until_free(user, first.conversation_id)
        follow = Asked("follow-up", FOLLOW_UP[n % len(FOLLOW_UP)], first.conversation_id)
        await ask(ws_base, cookie, follow)
        phases.asked += [first, follow]
        say(
            f"  {n + 1}/{count}: first {first.ttft:.2f} s ({first.prompt_tokens} tokens), "
            f"follow-up {follow.ttft:.2f} s ({follow.prompt_tokens} tokens)"
        )
    for question in on_topic_questions(count):
        asked = Asked("with passages", question, await create(user))
        await ask(ws_base, cookie, asked)
        phases.asked.append(asked)
        say(
            f"  with passages {asked.ttft:.2f} s ({asked.prompt_tokens} tokens, "
            f"{asked.passages} passages)"
        )
    return phases


def rebuilt_prompts(user, phases: Phases) -> list[tuple[Asked, list[dict]]]:
    """The prompt each question had, rebuilt from the stored conversation with the web's own
    code: the system prompt (with the same passages), then the turns up to the question."""
    from apps.chat.models import Conversation
    from apps.chat.prompt.prompting import prompt_build
    from apps.chat.submission import passages_for
    from apps.rag.prompting import passages_block

    rebuilt = []
    for asked in phases.asked:
        if asked.error:
            continue
        conversation = Conversation.objects.get(pk=asked.conversation_id)
        block = passages_block(passages_for(user=user, question=asked.question).passages)
        messages = prompt_build(conversation=conversation, passages=block).messages
        last = max(
            i
            for i, m in enumerate(messages)
            if m["role"] == "user" and m["content"] == asked.question
        )
        rebuilt.append((asked, messages[: last + 1]))
    return rebuilt


async def direct_engine(prompts: list[tuple[Asked, list[dict]]], *, slots: int) -> None:
    """The same prompts, in the same order, on the engine alone (make run's options)."""
    from worker.engines import create_engine
    from worker.engines.base import EngineRequest

    engine = create_engine("llamacpp", slots=slots)

    async def first_token(request_id: str, messages: list[dict]) -> float:
        request = EngineRequest(id=request_id, messages=messages, max_tokens=1, temperature=0.0)
        started = time.perf_counter()
        # Closed at once, so the slot is free (and chosen again) for the next prompt.
        async with contextlib.aclosing(engine.generate(request)) as outputs:
            async for output in outputs:
                if output.text or output.finish_reason:
                    break
        return time.perf_counter() - started

    await engine.start()
    try:
        for n, (asked, messages) in enumerate(prompts):
            if asked.phase == "follow-up":
                # Untimed: the cache then holds the first turn with the answer the stack gave,
                # as the worker's did when the follow-up came.
                await first_token(f"prime-{n}", messages[:-1])
            asked.direct_ttft = await first_token(f"direct-{n}", messages)
            asked.direct_prompt = engine.last_prompt
    finally:
        await engine.stop()


def worker_cache() -> tuple[int, int]:
    """(prompt tokens, of them found in the KV cache) over the worker's life, from its
    heartbeat (the engine's own counts)."""
    from core.redis_client import get_redis, keys

    client, k = get_redis(), keys()
    totals = [0, 0]
    for worker in client.zrange(k.workers, 0, -1):
        beat = client.get(k.heartbeat(worker))
        metrics = json.loads(beat).get("engine_metrics", {}) if beat else {}
        totals[0] += int(metrics.get("prompt_tokens", 0))
        totals[1] += int(metrics.get("cached_tokens", 0))
    return totals[0], totals[1]


def p50(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def report(phases: Phases) -> None:
    say(
        "p50 per phase: time to first token on the socket, inside the worker, and on the engine "
        "alone; prompt tokens, and of them those read (not in the KV cache) by the worker and "
        "by the engine alone; passages in the prompt (mean)"
    )
    say(
        f"{'phase':<14} {'n':>3} {'ttft':>7} {'worker':>7} {'alone':>7} {'prompt':>7} "
        f"{'read':>5} {'alone':>6} {'passages':>9}"
    )
    for phase in ("first", "follow-up", "with passages"):
        rows = phases.of(phase)
        read = [a.prompt_tokens - a.cached_tokens for a in rows]
        alone = [a.direct_prompt[0] - a.direct_prompt[1] for a in rows if a.direct_prompt[0]]
        ttft, worker = p50([a.ttft for a in rows]), p50([a.engine_ttft for a in rows])
        say(
            f"{phase:<14} {len(rows):>3} {ttft:>6.2f}s {worker:>6.2f}s "
            f"{p50([a.direct_ttft for a in rows]):>6.2f}s "
            f"{p50([a.prompt_tokens for a in rows]):>7.0f} {p50(read):>5.0f} {p50(alone):>6.0f} "
            f"{statistics.mean([a.passages for a in rows]) if rows else 0:>9.1f}"
        )
    prompt, cached = phases.worker_cache
    say(
        f"the worker read {prompt - cached} of {prompt} prompt tokens; {cached} came from its "
        "KV cache (a conversation's earlier turns)"
    )
    errors = [a for a in phases.asked if a.error]
    if errors:
        say(f"{len(errors)} questions failed, e.g. {errors[0].phase}: {errors[0].error}")
    load = os.getloadavg()
    say(
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores "
        "(the targets assume a quiet two-core machine)"
    )
    print(
        f"demo: first {p50([a.ttft for a in phases.of('first')]):.2f} s, "
        f"follow-up {p50([a.ttft for a in phases.of('follow-up')]):.2f} s, "
        f"with passages {p50([a.ttft for a in phases.of('with passages')]):.2f} s",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=20, help="per phase (at least 20)")
    parser.add_argument("--max-tokens", type=int, default=64, help="answer cap (default 64)")
    parser.add_argument("--no-direct", action="store_true", help="skip the engine-alone pass")
    args = parser.parse_args()
    count = min(args.questions, len(FIRST))
    var = VAR_DIR / "demo-ttft"
    with backing_services(var, redis_port=free_port()) as urls:
        env = dict(os.environ, **urls)
        env.update(
            DJANGO_SETTINGS_MODULE="chatsite.settings.dev",
            DEBUG="false",
            LOG_LEVEL="WARNING",
            SLUICE_HOST="127.0.0.1",
            SLUICE_PORT=str(free_port()),
            MODEL_MAX_TOKENS=str(args.max_tokens),
        )
        os.environ.update(urls)
        os.environ["MODEL_MAX_TOKENS"] = str(args.max_tokens)
        manage(env, "migrate", "--no-input", "-v", "0")
        manage(env, "ingest", "sluice-docs", "docs/", "--access", "everyone")
        manage(env, "rag_eval", "sluice-docs", "bench/sluice_docs_questions.jsonl", "--calibrate")
        user, cookie = prepare(count)
        supervisor = Supervisor(env=env)
        processes = app_processes(env)
        worker_argv = next(argv for name, argv in processes if name == "worker")
        slots = (
            int(worker_argv[worker_argv.index("--slots") + 1]) if "--slots" in worker_argv else 2
        )
        try:
            for name, argv in processes:
                supervisor.start(name, argv)
            from harness import wait_for_port  # bench/harness.py

            wait_for_port(int(env["SLUICE_PORT"]))
            ws_base = f"ws://127.0.0.1:{env['SLUICE_PORT']}"
            say("warming up (the worker loads the model, the web the embedding model)")
            warm = Asked("warm-up", "Hello!", new_conversation(user))
            asyncio.run(ask(ws_base, cookie, warm))
            say(f"asking {count} questions a phase, one at a time")
            phases = asyncio.run(run_phases(ws_base, cookie, user, count))
            time.sleep(3)  # the worker's next heartbeat carries its engine's counts
            phases.worker_cache = worker_cache()
        finally:
            supervisor.stop_all()
        if not args.no_direct:
            say("the engine alone, same prompts, same order (the stack is stopped)")
            asyncio.run(direct_engine(rebuilt_prompts(user, phases), slots=slots))
        report(phases)


if __name__ == "__main__":
    sys.path.insert(0, str(BASE_DIR / "bench"))
    main()
