"""Answer-length estimates and queue ETAs: the dispatcher's learned figures beside the old rules.

    .venv/bin/python bench/estimates.py                  # 5,000 answers, 200 users
    .venv/bin/python bench/estimates.py --answers 20000 --seed 3

1. estimate: a skewed generated workload (70 % simple questions, 30 % that ask for long
   answers; chat, rag, long and background kinds; users whose answers run 4x shorter or longer
   than others'; a log-normal spread around each) goes through apps/admission/estimates.py in
   arrival order, each answer predicted before it is learned, as the dispatcher does. Printed:
   the median absolute percentage error and the share under-estimated by more than half, for
   the learned estimate and for the old rule (`chars/4 + 4 + max_tokens` reserves max_tokens
   for the answer), on the answer's length and on the whole charge (prompt + answer), over the
   answers after the first `--warmup`. The oracle knows each answer's length before the
   workload's random spread (log-normal, sigma 0.25): no estimate can beat its error.
2. eta: the queue ETA told to each waiting request against the wait it really had, on a line
   served by two models of different speeds (a fast one and one 6x slower, with skewed answer
   times): the old rule (one service time for every model, 10 s until it learns) beside the
   per-model service times of apps/admission/servicetimes.py, both through the same formula
   positions.py uses (place over the model's slots, times the service time).

Pure Python, no servers: the same classes the dispatcher runs, fed in the same order. Prints
figures; asserts nothing. The last line sums it up.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BASE_DIR)]

SIMPLE = [
    "What is the capital of {}?",
    "Who wrote {}?",
    "When was {} founded?",
    "How many people live in {}?",
    "Is {} true, yes or no?",
    "Define {}.",
]
COMPLEX = [
    "Explain how {} works, step by step.",
    "Write a short essay about {}.",
    "Compare {} with its alternatives in detail.",
    "List the steps to set up {}.",
    "Describe the history of {} and why it matters.",
]
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
]


def workload(answers: int, users: int, seed: int):
    """(kind, user, plan, prompt tokens, max_tokens, question, real answer tokens, and the
    length the workload meant before its random spread: what a perfect estimate would say)."""
    rng = random.Random(seed)
    lean = {u: rng.choice([0.25, 0.5, 1, 1, 1, 2, 4]) for u in range(users)}  # terse to verbose
    plan_of = {u: "pro" if u % 5 == 0 else "free" for u in range(users)}
    for _ in range(answers):
        user = min(users - 1, int(rng.paretovariate(1.2)) - 1)  # a few users send most
        simple = rng.random() < 0.7
        question = rng.choice(SIMPLE if simple else COMPLEX).format(rng.choice(TOPICS))
        kind = rng.choices(["chat", "rag", "long", "background"], [55, 30, 5, 10])[0]
        prompt = {"chat": 120, "rag": 900, "long": 2500, "background": 1400}[kind]
        prompt = int(prompt * rng.uniform(0.6, 1.6))
        base = 40 if simple else 320
        base *= {"chat": 1, "rag": 1.3, "long": 1.6, "background": 0}[kind] or 0
        if kind == "background":
            base = 150  # summaries: about the same length whatever was asked
        max_tokens = 1024 if plan_of[user] == "pro" else 512
        meant = base * lean[user]
        real = meant * math.exp(rng.gauss(0, 0.25))
        yield (
            kind,
            str(user),
            plan_of[user],
            prompt,
            max_tokens,
            question,
            max(1, min(max_tokens, round(real))),
            max(1, min(max_tokens, round(meant))),
        )


def estimate_errors(args) -> dict[str, tuple[float, float]]:
    from apps.admission.estimates import Estimator, Sample
    from worker.protocol import Keys

    estimator = Estimator(Keys(prefix="bench"))
    rows = {
        "answer learned": [],
        "answer rule": [],
        "answer oracle": [],
        "charge learned": [],
        "charge rule": [],
    }
    for i, (kind, user, plan, prompt, max_tokens, question, real, meant) in enumerate(
        workload(args.answers, args.users, args.seed)
    ):
        guess = estimator.guess(
            kind=kind,
            user_id=user,
            plan=plan,
            prompt_tokens=prompt,
            max_tokens=max_tokens,
            question=question,
        )
        if i >= args.warmup:
            rows["answer learned"].append((guess.tokens - real) / real)
            rows["answer rule"].append((max_tokens - real) / real)
            rows["answer oracle"].append((meant - real) / real)
            used = prompt + real
            rows["charge learned"].append((prompt + guess.tokens - used) / used)
            rows["charge rule"].append((prompt + max_tokens - used) / used)
        estimator.learn([Sample(guess.x, guess.tokens, max_tokens, user, plan, real)])
    return {
        name: (
            statistics.median(abs(e) for e in errors),
            sum(e < -0.5 for e in errors) / len(errors),
        )
        for name, errors in rows.items()
    }


def eta_errors(args) -> dict[str, float]:
    """Median |told - waited| / waited for the old rule and the per-model service times: each
    request is told both ETAs as it joins its model's line, and compared with its real wait
    when a slot takes it."""
    from apps.admission.servicetimes import ServiceTimes
    from worker.protocol import Keys

    rng = random.Random(args.seed)
    speeds = {"fast": 2.0, "slow": 12.0}  # median seconds an answer takes
    slots = {"fast": 4, "slow": 2}
    measured = ServiceTimes(Keys(prefix="bench"))
    old = 10.0  # the old rule: one figure for every model, moved 20 % by each answer
    errors: dict[str, list[float]] = {"rule": [], "measured": []}
    free_at = {m: [0.0] * n for m, n in slots.items()}  # when each slot frees
    line: dict[str, list[tuple[float, float, float]]] = {m: [] for m in slots}
    now = 0.0

    def serve(model: str, at: float) -> None:
        nonlocal old
        frees = free_at[model]
        took = speeds[model] * math.exp(rng.gauss(0, 0.6))
        frees[frees.index(min(frees))] = at + took
        measured.learn(model, took)  # learned as it ends; close enough for this figure
        old = 0.8 * old + 0.2 * took

    for _ in range(args.answers):
        now += rng.expovariate(1 / 0.6)
        for model, frees in free_at.items():  # slots that freed meanwhile take the line's head
            while line[model] and min(frees) <= now:
                at = min(frees)
                arrived, told_old, told_new = line[model].pop(0)
                waited = max(0.05, at - arrived)
                errors["rule"].append(abs(told_old - waited) / waited)
                errors["measured"].append(abs(told_new - waited) / waited)
                serve(model, at)
        model = rng.choices(["fast", "slow"], [92, 8])[0]  # each busy, neither over
        if not line[model] and min(free_at[model]) <= now:
            serve(model, now)  # a free slot: it does not wait
            continue
        place = len(line[model]) + 1
        line[model].append(
            (now, place / slots[model] * old, measured.eta(model, place=place, slots=slots[model]))
        )
    return {name: statistics.median(values) for name, values in errors.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answers", type=int, default=5000)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    results = estimate_errors(args)
    print(f"estimate over {args.answers - args.warmup} answers (after {args.warmup} learned):")
    for name, (ape, under) in results.items():
        print(
            f"  {name:15s} median |error| {ape * 100:6.1f} %   under by > 50 %: "
            f"{under * 100:5.1f} %"
        )
    eta = eta_errors(args)
    print(
        f"eta: median |told - waited| / waited: old rule {eta['rule'] * 100:.0f} %, "
        f"measured per model {eta['measured'] * 100:.0f} %"
    )
    print(
        f"estimates: answer length error {results['answer learned'][0] * 100:.1f} % learned vs "
        f"{results['answer rule'][0] * 100:.1f} % max_tokens rule, under by > 50 % "
        f"{results['answer learned'][1] * 100:.1f} %; eta error "
        f"{eta['measured'] * 100:.0f} % vs {eta['rule'] * 100:.0f} %"
    )


if __name__ == "__main__":
    main()
