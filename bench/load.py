"""Capacity: the highest arrival rate `make run` sustains with its defaults, time to first token
p99 within 2 s and errors within 0.1 %.

    .venv/bin/python bench/load.py                      # make run's llama.cpp worker, ~8 min
    .venv/bin/python bench/load.py --start 0.2 --step 0.2 --step-seconds 45
    .venv/bin/python bench/load.py --engine simulated   # the gateway's own ceiling

Starts what `make run` starts, as it starts it (embedded PostgreSQL and Redis under
$SLUICE_VAR_DIR/load, migrations, the demo accounts, the demo corpus ingested from docs/ with
its relevance gate calibrated; then web, dispatcher and worker with make run's settings:
retrieval, follow-up suggestions, titles, summaries and tag proposals on, the default plan's
rate limits). PostgreSQL's data is kept between runs, as make run keeps it (ingestion skips
unchanged files); Redis starts empty.

The worker: `llamacpp` (default) is make run's own, SmolLM2-135M on the CPU cores this machine
shares with everything else, so the figure is what make run serves on this machine; `simulated`
swaps it for the benchmark engine at GPU speed (first token 20 ms, 25 ms a token, --sim-slots
sequences, --sim-tokens a person's answer) to find where the web, dispatcher, PostgreSQL and
Redis themselves stop, with no model in the way.

People (load_users.py): --users of them, --api-share on the REST API (POST, then the SSE
stream), the rest in the browser (the new-chat form, the page, the chat and inbox sockets).
Questions arrive open loop, as a Poisson stream at the step's rate, whatever the service does;
each goes to a person not waiting for an answer, who starts a new chat (--new-share, or when
they have none) or continues theirs; a --topic share asks about Sluice (passages in the prompt).

The rate starts at --start and rises by --step every --step-seconds until a step's questions
have time to first token p99 above 2 s or errors above 0.1 %. A question not answered within
60 s is an error; questions still open when a step is judged count with the time they have
waited (as errors once past 60 s). The capacity is the last step that passed, judged again at
the end of the run with what its open questions met since. CPU per answer, per process tree
(read from /proc; PostgreSQL's exited backends included), is that step's CPU over the answers
that ended in it. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import random
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BASE_DIR), str(BASE_DIR / "bench")]

from harness import Running, percentile, setup_django, tree_cpu_seconds, wait_for_port  # noqa: E402
from load_users import ApiUser, Asked, Browser, Mix, Person, create_people, warm_up  # noqa: E402

from devstack.stack import (  # noqa: E402
    VAR_DIR,
    Supervisor,
    app_processes,
    backing_services,
    free_port,
    manage,
    say,
)

TTFT_BOUND = 2.0  # seconds, p99
ERROR_BOUND = 0.1  # percent
TIMES = ("sent", "first", "end")
ROLES = ("web", "dispatcher", "postgres", "redis", "worker", "embedder")
DEFAULTS = {  # per engine: first rate, step (req/s), step length (s), people
    "llamacpp": (0.05, 0.05, 60.0, 150),
    "simulated": (5.0, 5.0, 30.0, 600),
}


@dataclass
class Verdict:
    asked: int
    answered: int
    errors: int
    still_open: int
    p50: float
    p99: float
    p99_topic: float
    reasons: Counter

    @property
    def error_share(self) -> float:
        return self.errors / self.asked * 100 if self.asked else 0.0

    @property
    def passed(self) -> bool:
        return bool(self.asked) and self.p99 <= TTFT_BOUND and self.error_share <= ERROR_BOUND


def judge(asked: list[Asked], now: float) -> Verdict:
    """The step's questions as they stand at `now`: open ones count with the time they have
    waited, and as errors once past the limit."""
    failed = [a for a in asked if a.failed(now)]
    waits = [a.waited(now) for a in asked]
    topic = [a.waited(now) for a in asked if a.topic]
    return Verdict(
        asked=len(asked),
        answered=sum(a.ok for a in asked),
        errors=len(failed),
        still_open=sum(a.end is None for a in asked),
        p50=percentile(waits, 50),
        p99=percentile(waits, 99),
        p99_topic=percentile(topic, 99),
        reasons=Counter(a.reason or "open past the limit" for a in failed),
    )


@dataclass
class Step:
    rate: float
    start: float
    end: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # seconds, per role, in the step
    answers: int = 0  # answers that ended in the step (whenever asked)
    verdict: Verdict | None = None

    def ms_per_answer(self, role: str) -> float:
        return self.cpu.get(role, 0.0) * 1000 / max(self.answers, 1)


class Load:
    """The sweep: arrivals at each step's rate, each question to an idle person."""

    def __init__(self, people: list[Person], api: list[Person], mix: Mix, args, cpu) -> None:
        self.people, self.api, self.mix, self.args, self.cpu = people, api, mix, args, cpu
        self.rng = random.Random(args.seed)
        self.asked: list[Asked] = []
        self.steps: list[Step] = []
        self.tasks: set[asyncio.Task] = set()
        self.web_rss_mb = 0.0  # the web processes' resident memory at the end
        self.web_torch = False  # ... and whether torch was loaded in them

    def arrive(self, step: int) -> None:
        now = time.perf_counter()
        on_api = self.rng.random() < self.args.api_share
        pool = self.api if on_api else self.people
        idle = [p for p in pool if p.idle(now)]
        path = "api" if on_api else "page"
        if not idle:  # the bench's own shortfall, never hidden: an error
            self.asked.append(
                Asked(step, path, True, False, now, end=now, reason="no idle person: raise --users")
            )
            return
        person = self.rng.choice(idle)
        new = not person.has_chat or self.rng.random() < self.args.new_share
        text, topic = self.mix.question(new=new)
        asked = Asked(step, path, new, topic, now)
        self.asked.append(asked)
        person.busy = True  # taken now: the next arrival picks someone else
        task = asyncio.ensure_future(person.ask(asked, text))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def run(self) -> float:
        """Steps until one fails; returns when the run ended (perf_counter)."""
        args, rate = self.args, self.args.start
        for index in range(args.max_steps):
            step = Step(rate, time.perf_counter())
            self.steps.append(step)
            before, end, due = self.cpu(), step.start + args.step_seconds, step.start
            while (due := due + self.rng.expovariate(rate)) < end:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                self.arrive(index)
            await asyncio.sleep(max(0.0, end - time.perf_counter()))
            step.end, after = time.perf_counter(), self.cpu()
            step.cpu = {role: after[role] - before.get(role, 0.0) for role in after}
            step.answers = sum(
                a.ok and step.start <= a.end <= step.end for a in self.asked if a.end
            )
            verdict = judge([a for a in self.asked if a.step == index], step.end)
            say(
                f"{rate:6.2f} req/s: {verdict.asked} asked, ttft p50 {verdict.p50:.2f} s p99 "
                f"{verdict.p99:.2f} s, errors {verdict.errors}, open {verdict.still_open}, "
                f"{sum(step.cpu.values()) / args.step_seconds:.2f} cores busy: "
                f"{'passed' if verdict.passed else 'over the bound'}"
            )
            if not verdict.passed:
                break
            rate = round(rate + args.step, 6)
        return time.perf_counter()

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await asyncio.gather(*(p.close() for p in self.people + self.api), return_exceptions=True)


async def drive(base_url: str, cookies: list[str], keys: list[str], args, cpu):
    import httpx

    limits = httpx.Limits(max_connections=len(keys) * 2 + 10)
    async with httpx.AsyncClient(timeout=70, limits=limits) as http:
        people: list[Person] = [Browser(base_url, cookie) for cookie in cookies]
        api: list[Person] = [ApiUser(http, base_url, key) for key in keys]
        gate = asyncio.Semaphore(8)  # the pages people had open: loaded a few at a time

        async def open_form(browser) -> None:
            async with gate:
                await browser.open_form()

        await asyncio.gather(*(open_form(p) for p in people))
        await warm_up(people[0], api[0] if api else people[-1])
        load = Load(people, api, Mix(random.Random(args.seed + 1), args.topic), args, cpu)
        try:
            ended = await load.run()
            for step, index in zip(load.steps, range(len(load.steps)), strict=True):
                step.verdict = judge([a for a in load.asked if a.step == index], ended)
            if args.dump:  # each question, times in seconds from the first step's start
                zero = load.steps[0].start
                with open(args.dump, "w") as out:
                    for a in load.asked:
                        row = {k: v - zero if k in TIMES and v else v for k, v in vars(a).items()}
                        out.write(json.dumps({**row, "open_at_end": a.end is None}) + "\n")
        finally:
            await load.close()
    return load


def worker_argv(args) -> list[str] | None:
    """The simulated worker's command (None: make run's own)."""
    if args.engine == "llamacpp":
        return None
    engine = f"-m worker --engine simulated --slots {args.sim_slots} --sim-tokens {args.sim_tokens}"
    return [sys.executable, *engine.split(), "--sim-first-token-ms", "20", "--sim-decode-ms", "25"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--engine", choices=sorted(DEFAULTS), default="llamacpp")
    add("--start", type=float, help="first arrival rate, req/s (llamacpp 0.05, simulated 5)")
    add("--step", type=float, help="rate added each step, req/s (llamacpp 0.05, simulated 5)")
    add("--step-seconds", type=float, help="length of each step (llamacpp 60, simulated 30)")
    add("--max-steps", type=int, default=5)
    add("--users", type=int, help="people, browser and API (llamacpp 150, simulated 600)")
    add("--api-share", type=float, default=0.2, help="share of questions from API users")
    add("--new-share", type=float, default=0.4, help="share of questions that start a chat")
    add("--topic", type=float, default=0.3, help="share of questions about Sluice (passages)")
    add("--sim-slots", type=int, default=256, help="simulated: concurrent sequences")
    add("--sim-tokens", type=int, default=200, help="simulated: a person's answer, tokens")
    add("--seed", type=int, default=11)
    add("--dump", help="write each question's times and outcome to this file (JSON lines)")
    add(
        "--fleet-embedding",
        action="store_true",
        help="questions embedded by an embedding worker (RAG_EMBEDDING_SERVING=fleet), not in "
        "the web process",
    )
    args = parser.parse_args()
    names = ("start", "step", "step_seconds", "users")
    for name, value in zip(names, DEFAULTS[args.engine], strict=True):
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.load_before = os.getloadavg()[0]  # other work on the machine shares its cores
    var = VAR_DIR / "load"
    var.mkdir(parents=True, exist_ok=True)
    lock = (var / "lock").open("w")  # one run at a time: they would share one PostgreSQL
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    shutil.rmtree(var / "redis", ignore_errors=True)  # no streams left from an earlier run
    with backing_services(var, redis_port=free_port()) as urls:
        port = free_port(int(os.environ.get("SLUICE_PORT", "8000")))
        env = dict(
            os.environ,
            **urls,
            DJANGO_SETTINGS_MODULE="chatsite.settings.dev",
            DEBUG="false",
            LOG_LEVEL="WARNING",
            SLUICE_HOST="127.0.0.1",
            SLUICE_PORT=str(port),
        )
        os.environ.update(urls)
        # What `make run` does before it starts the processes (devstack/stack.py command_run).
        manage(env, "migrate", "--no-input", "-v", "0")
        manage(env, "seed_demo")
        manage(env, "ingest", "sluice-docs", "docs/", "--access", "everyone")
        manage(env, "rag_eval", "sluice-docs", "bench/sluice_docs_questions.jsonl", "--calibrate")
        os.environ["LOG_LEVEL"] = "WARNING"  # this process's own logs (httpx's per request)
        setup_django()
        api_count = round(args.users * args.api_share)
        started = time.perf_counter()
        cookies, keys = create_people(args.users - api_count, api_count, str(os.getpid()))
        say(f"{args.users} people signed in in {time.perf_counter() - started:.0f} s")
        # The processes (not the ingestion above) embed where --fleet-embedding says.
        env["RAG_EMBEDDING_SERVING"] = "fleet" if args.fleet_embedding else "local"
        supervisor = Supervisor(env=env)
        try:
            start_processes(supervisor, env, args, var / "processes.log")
            wait_for_port(port)
            base = f"http://127.0.0.1:{port}"
            running = Running(env, base, base.replace("http", "ws"), supervisor, var=var)
            say(
                f"{args.engine} worker; {args.users} people; rate from {args.start:g} req/s, "
                f"+{args.step:g} every {args.step_seconds:g} s; load average before the stack "
                f"started {args.load_before:.1f} on {os.cpu_count()} cores"
            )
            load = asyncio.run(drive(base, cookies, keys, args, cpu_reader(running)))
            load.web_rss_mb, load.web_torch = resident_mb(running.processes().get("web", []))
        finally:
            supervisor.stop_all()
    report(load, args)


def start_processes(supervisor: Supervisor, env: dict[str, str], args, log: Path) -> None:
    """make run's processes (the worker swapped for --engine simulated), their output (daphne's
    access log, one line a request) to `log` so that the figures stay readable."""
    say(f"the processes' output goes to {log}")
    saved = [os.dup(1), os.dup(2)]
    with log.open("ab") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            for name, argv in app_processes(env):
                supervisor.start(name, (worker_argv(args) or argv) if name == "worker" else argv)
        finally:
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)


def resident_mb(pids: list[int]) -> tuple[float, bool]:
    """Resident memory of these processes, in MB (VmRSS), and whether any has torch loaded."""
    total, torch = 0, False
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            torch = torch or "libtorch" in Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        rss = (line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
        total += int(next(rss, 0))
    return total / 1024, torch


def cpu_reader(running: Running):
    """CPU seconds so far per role (process trees), and this bench's own as "clients"."""

    def read() -> dict[str, float]:
        found = tree_cpu_seconds(running.processes())
        times = os.times()
        found["clients"] = times.user + times.system
        return found

    return read


def report(load: Load, args) -> None:
    say(
        "per step, judged at the end of the run: rate, questions asked, answered, errors, "
        "still open; ttft p50 / p99 (p99 of the questions with passages); cores busy"
    )
    capacity: Step | None = None
    for step in load.steps:
        v = step.verdict
        assert v is not None
        seconds = step.end - step.start
        busy = sum(c for role, c in step.cpu.items() if role != "clients") / seconds
        say(
            f"{step.rate:6.2f} req/s {v.asked:5d} asked {v.answered:5d} answered {v.errors:4d} "
            f"errors {v.still_open:4d} open  ttft {v.p50:6.2f} / {v.p99:6.2f} s "
            f"({v.p99_topic:.2f} s)  {busy:.2f} "
            f"cores + clients {step.cpu.get('clients', 0) / seconds:.2f}  "
            f"{'passed' if v.passed else 'over the bound'}"
        )
        for reason, count in v.reasons.most_common(3):
            say(f"    error x{count}: {reason}")
    for step in load.steps:  # the last of the steps that passed from the first on
        if not step.verdict or not step.verdict.passed:
            break
        capacity = step
    shown = capacity or load.steps[0]
    v = shown.verdict
    assert v is not None
    rate = capacity.rate if capacity else 0.0
    cpu = {role: shown.ms_per_answer(role) for role in ROLES}
    worker = (
        "make run's llama.cpp worker (SmolLM2-135M on this machine's CPU)"
        if args.engine == "llamacpp"
        else f"the simulated engine at GPU speed ({args.sim_slots} sequences)"
    )
    say(
        f"query embedding: {'an embedding worker' if args.fleet_embedding else 'in the web'}; "
        f"web resident memory {load.web_rss_mb:.0f} MB (torch "
        f"{'loaded' if load.web_torch else 'not loaded'}); web cpu "
        f"{cpu['web']:.1f} ms/request, embedder {cpu['embedder']:.1f} ms/request"
    )
    say(
        f"worker: {worker}; {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}; the clients' own CPU "
        f"{shown.ms_per_answer('clients'):.1f} ms/answer (not in the total)"
    )
    if capacity is None:
        say(
            f"no step passed: the capacity is below {load.steps[0].rate:g} req/s (ttft p50 "
            f"{v.p50:.2f} s there; a lower --start finds it, if any)"
        )
    elif capacity is load.steps[-1]:
        say(f"every step passed up to --max-steps: the capacity is {rate:g} req/s or more")
    print(
        f"load: capacity {rate:g} req/s at ttft p99 <= 2 s (errors {v.error_share:.2f} %), "
        f"cpu {sum(cpu.values()):.1f} ms/request (web {cpu['web']:.1f}, dispatcher "
        f"{cpu['dispatcher']:.1f}, postgres {cpu['postgres']:.1f}, redis {cpu['redis']:.1f}, "
        f"worker {cpu['worker']:.1f})",
        flush=True,
    )


if __name__ == "__main__":
    main()
