"""Queue ETAs on the real llama.cpp worker: what a waiting request is told, against the wait it
really had, behind 2-4 long answers.

    .venv/bin/python bench/eta.py                  # 10 rounds, about two minutes
    .venv/bin/python bench/eta.py --rounds 20 --seed 3

Starts embedded PostgreSQL and Redis, the dispatcher and `make run`'s llama.cpp worker (its
default two slots and answer cap, here --max-tokens), without the web: the ETA is the
dispatcher's, and the page and the SSE stream relay its events as they are. One user with
roomy limits asks through the web's own submission code (`request_submit`), each question in a
conversation of its own, and the bench reads each request's events from Redis as they come.

First a warm-up (short and long questions, not measured), so that both ETAs start from a
history as a running service has: the answer-length estimator has learned (it needs 30
answers) and the service time's moving average has settled. The warm-up is phrased apart from
the measured questions: no measured phrasing was learned from before it is measured. Then each
round sends a couple of short questions (a chat service's mix), then 2-4 long answers at once
(a tale, a long letter: they run to the cap, or near it), then one or two more questions a
random moment later, which wait behind what is left of the long ones. Every request that was
told a place in line is a wait. Its error is |ETA - wait| / wait, the wait from the first
position event to the moment a worker started it (its first text less the engine's own time to
first token), at least 1 s (ETAs are told in whole seconds, at least 1).

Side by side, for the same waits at the same moments: the ETA the dispatcher told (what is left
of the running answers and of each request ahead, at the measured speed), and the old rule
(the place over the model's slots times the moving average of its service time), computed
from the dispatcher's own service-time figures in Redis as the wait began
(`ServiceTimes.eta`, the code that told ETAs before).

Prints figures; asserts nothing. Last line: `eta: median error <e> % (moving average <m> %)
over <n> waits`.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BASE_DIR), str(BASE_DIR / "bench")]

from devstack.stack import (  # noqa: E402
    VAR_DIR,
    Supervisor,
    app_processes,
    backing_services,
    free_port,
    manage,
    say,
)

# Phrased in people's words. The warm-up's phrasings (WARM_*) are none of the measured rounds':
# what the estimator learned in the warm-up reaches the measured questions only through the
# words they share, and from then on it learns from their answers, as it would in service.
WARM_SHORT = [
    "Capital of {}? Just the city.",
    "Is {} bigger than Spain? Reply in one line.",
    "What currency does {} use? Only the name.",
]
WARM_LONG = [
    "Spin a long yarn set in {}, with plenty of scenes.",
    "Go on at length about {}, covering all you can think of.",
    "Compose a long diary entry of a day spent with {}.",
]
SHORT = [
    "Which continent is {} on? Reply with just its name.",
    "{}: north or south of the equator? A single word, please.",
    "Does {} have a coastline? Reply with only that.",
]
PLACES = ["France", "Japan", "Brazil", "Kenya", "Canada", "Italy", "Peru", "India", "Egypt"]
LONG = [
    "Tell me a long tale about {}, many paragraphs, as rich as you can make it.",
    "I'd love a lengthy letter to a friend all about {}; go on for as long as you like.",
    "Give me everything about {}: go on at great length, paragraph after paragraph.",
]
TOPICS = [
    "a lighthouse keeper",
    "the ocean",
    "a trip to the mountains",
    "how bread is made",
    "the history of trains",
    "a dragon who learns to cook",
    "the solar system",
    "a small village in winter",
    "how bees live",
]


@dataclass
class Asked:
    id: str
    long: bool
    sent: float
    told_at: float = 0.0  # first position event
    place: int = 0
    eta: float = 0.0  # seconds, as told by the dispatcher
    baseline: float = 0.0  # seconds, the old rule at the same moment
    first_text: float = 0.0
    engine_ttft: float = 0.0
    state: str = ""

    @property
    def waited(self) -> float:
        return self.first_text - self.engine_ttft - self.told_at


class Watcher:
    """Reads every request's events from Redis as they come, on a thread of its own."""

    def __init__(self, client, keys) -> None:
        self.client, self.keys = client, keys
        self.asked: dict[str, Asked] = {}
        self.last: dict[str, str] = {}  # output stream → last id read
        self.ids: dict[str, str] = {}  # output stream → request id
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def add(self, asked: Asked) -> None:
        with self.lock:
            self.asked[asked.id] = asked
            self.last[self.keys.output(asked.id)] = "0"
            self.ids[self.keys.output(asked.id)] = asked.id

    def run(self) -> None:
        import json

        from apps.admission.servicetimes import ServiceTimes

        old = ServiceTimes(self.keys)
        while not self.stop.is_set():
            with self.lock:
                streams = dict(self.last)
            if not streams:
                time.sleep(0.02)
                continue
            for stream, entries in self.client.xread(streams, block=50) or []:
                now = time.time()
                asked = self.asked[self.ids[stream]]
                for entry_id, fields in entries:
                    with self.lock:
                        self.last[stream] = entry_id
                    if fields.get("position") and not asked.told_at:
                        asked.told_at, asked.place = now, int(fields["position"])
                        asked.eta = float(fields["eta_seconds"])
                        model, slots = self.fleet()
                        old.load(self.client)  # the figures the dispatcher has now
                        eta = old.eta(model, place=asked.place, slots=slots)
                        asked.baseline = max(1, round(eta))
                    elif fields.get("type") == "delta" and not asked.first_text:
                        asked.first_text = now
                    elif fields.get("type") == "final":
                        asked.state = fields.get("state", "")
                        usage = json.loads(fields.get("usage") or "{}")
                        asked.engine_ttft = float(usage.get("ttft_ms") or 0) / 1000
                        if not asked.first_text:
                            asked.first_text = now
                        with self.lock:
                            del self.last[stream]

    def fleet(self) -> tuple[str, int]:
        import json

        for worker in self.client.zrange(self.keys.workers, 0, -1):
            beat = self.client.get(self.keys.heartbeat(worker))
            if beat:
                beat = json.loads(beat)
                return str(beat.get("model") or ""), int(beat.get("slots") or 1)
        return "", 1

    def wait_all(self, ids: list[str], timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.asked[i].state for i in ids):
                return
            time.sleep(0.05)
        raise SystemExit("answers did not end in time")


def prepare():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")
    import django

    django.setup()
    from apps.accounts.services import user_create
    from apps.admission.models import Plan

    Plan.objects.filter(is_default=True).update(
        requests_per_minute=1_000_000,
        burst_requests=1_000_000,
        tokens_per_minute=10**9,
        burst_tokens=10**9,
        tokens_per_day=10**8,
        max_concurrent=10_000,
        max_queue_wait_seconds=3600,
    )
    return user_create(username=f"eta{os.getpid()}", password="bench-password-1")


def ask(user, watcher: Watcher, text: str, *, long: bool) -> Asked:
    from apps.chat.services import conversation_create
    from apps.chat.submission import Question, request_submit

    conversation = conversation_create(owner=user, title="eta")
    sent = time.time()
    request_id = request_submit(
        Question(user=user, conversation=conversation, text=text)
    ).request_id
    asked = Asked(request_id, long, sent)
    watcher.add(asked)
    return asked


def question(rng: random.Random, long: bool, *, warm: bool = False) -> str:
    if long:
        return rng.choice(WARM_LONG if warm else LONG).format(rng.choice(TOPICS))
    return rng.choice(WARM_SHORT if warm else SHORT).format(rng.choice(PLACES))


def run(user, watcher: Watcher, *, rounds: int, warmup: int, seed: int) -> list[Asked]:
    rng = random.Random(seed)
    say(f"warm-up: {warmup} answers, not measured")
    for _ in range(0, warmup, 4):
        batch = [
            ask(user, watcher, question(rng, n % 2 == 1, warm=True), long=n % 2 == 1)
            for n in range(4)
        ]
        watcher.wait_all([a.id for a in batch])
    measured: list[Asked] = []
    for n in range(rounds):
        started = time.monotonic()
        batch = [ask(user, watcher, question(rng, False), long=False) for _ in range(2)]
        watcher.wait_all([a.id for a in batch])
        batch = [
            ask(user, watcher, question(rng, True), long=True) for _ in range(rng.randint(2, 4))
        ]
        time.sleep(rng.uniform(0.5, 4.0))
        for _ in range(rng.randint(1, 2)):
            long = rng.random() < 0.5
            batch.append(ask(user, watcher, question(rng, long), long=long))
        watcher.wait_all([a.id for a in batch])
        waits = [a for a in batch if a.told_at]
        measured += batch
        say(
            f"  round {n + 1}/{rounds}: {len(batch)} asked, {len(waits)} waited: "
            + ", ".join(
                f"#{a.place} told {a.eta:.0f} s (old {a.baseline:.0f} s), waited {a.waited:.1f} s"
                for a in waits
            )
            + f" [{time.monotonic() - started:.0f} s]"
        )
    return measured


def error(told: float, waited: float) -> float:
    return abs(told - waited) / max(waited, 1.0) * 100


def report(measured: list[Asked]) -> None:
    waits = [a for a in measured if a.told_at and a.state == "done" and a.first_text]
    failed = [a for a in measured if a.state != "done"]
    new = [error(a.eta, a.waited) for a in waits]
    old = [error(a.baseline, a.waited) for a in waits]
    if not waits:
        raise SystemExit("no request waited: nothing to measure")
    say(f"{len(waits)} waits, {len(failed)} answers not done")
    say(f"{'':<22} {'median':>7} {'p90':>7} {'mean':>7}")
    for name, errors in (("what is left", new), ("moving average", old)):
        p90 = statistics.quantiles(errors, n=10)[-1] if len(errors) > 1 else errors[0]
        say(
            f"{name:<22} {statistics.median(errors):>6.0f}% {p90:>6.0f}% "
            f"{statistics.mean(errors):>6.0f}%"
        )
    say(
        f"waits: median {statistics.median(a.waited for a in waits):.1f} s, "
        f"longest {max(a.waited for a in waits):.1f} s"
    )
    load = os.getloadavg()
    say(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    print(
        f"eta: median error {statistics.median(new):.0f} % (moving average "
        f"{statistics.median(old):.0f} %) over {len(waits)} waits",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=32, help="answers before measuring")
    parser.add_argument("--max-tokens", type=int, default=128, help="answer cap")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    var = VAR_DIR / "bench-eta"
    shutil.rmtree(var, ignore_errors=True)  # nothing learned by an earlier run
    with backing_services(var, redis_port=free_port()) as urls:
        env = dict(os.environ, **urls)
        env.update(
            DJANGO_SETTINGS_MODULE="chatsite.settings.dev",
            DEBUG="false",
            LOG_LEVEL="WARNING",
            MODEL_MAX_TOKENS=str(args.max_tokens),
            RAG_WARM_UP="false",
            # Work Sluice starts itself would take slots at moments the bench does not choose.
            SLUICE_FOLLOWUPS="false",
            SLUICE_TITLES="false",
            SLUICE_TAG_PROPOSAL_EVERY="0",
            SLUICE_SUMMARIES="false",
        )
        os.environ.update(env)  # this process submits as the web would
        manage(env, "migrate", "--no-input", "-v", "0")
        user = prepare()
        from core.redis_client import get_redis, keys

        supervisor = Supervisor(env=env)
        try:
            for name, argv in app_processes(env):
                if name != "web":
                    supervisor.start(name, argv)
            watcher = Watcher(get_redis(), keys())
            watcher.thread.start()
            say("waiting for the worker (it loads the model)")
            first = ask(user, watcher, "Hello!", long=False)
            watcher.wait_all([first.id], timeout=300)
            measured = run(user, watcher, rounds=args.rounds, warmup=args.warmup, seed=args.seed)
            watcher.stop.set()
        finally:
            supervisor.stop_all()
        report(measured)


if __name__ == "__main__":
    main()
