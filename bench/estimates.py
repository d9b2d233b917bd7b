"""Answer-length estimates and queue ETAs: the dispatcher's learned figures beside the simple
rules an operator would otherwise run.

    .venv/bin/python bench/estimates.py                  # 6,000 answers, 200 users
    .venv/bin/python bench/estimates.py --answers 20000 --seed 3

1. estimate: a generated workload goes through apps/admission/estimates.py in arrival order,
   each answer predicted before it is learned, as the dispatcher does. Beside it, the same
   answers predicted by simple online baselines that see the same history: the global median
   of the answers so far, the median per kind, per user and per kind and user, and the old
   `max_tokens` rule. Printed: the median absolute percentage error and the share
   under-estimated by more than half, over the answers after `--warmup`.

   The workload (bench/estimates_data.py) is not the estimator's own form: questions are
   short, medium or long by what they ask, users have habits (some ask mostly long questions,
   some get wordier answers, in tokens added as well as in proportion), long answers often run
   to the cap, some answers are refusals or clarifications whatever was asked, and background
   summaries sit near their own cap. Half the questions use phrasings that the estimator's
   keyword lists were written for; the other half are held apart: phrasings none of whose words
   are in those lists. The headline is measured on the held-apart half.
2. eta: the queue ETA told to each waiting request against the wait it really had, on a line
   served by two models of different speeds (a fast one and one 6x slower, with skewed answer
   times): the old rule (one service time for every model, 10 s until it learns) beside the
   per-model service times of apps/admission/servicetimes.py, both through the same formula
   positions.py uses (place over the model's slots, times the service time).

Pure Python, no servers: the same classes the dispatcher runs, fed in the same order. Prints
figures; asserts nothing. Last line: `estimates: answer length error <l> % learned vs <b> % best
simple baseline (<name>), vs <m> % max_tokens rule; eta error <e> %` (held-apart phrasings).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections import defaultdict, deque
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BASE_DIR), str(BASE_DIR / "bench")]

from estimates_data import workload  # noqa: E402

BASELINES = ("global median", "median per kind", "median per user", "median per kind+user")
KEPT = {
    "global median": 500,
    "median per kind": 300,
    "median per user": 40,
    "median per kind+user": 30,
}  # answers each median remembers, newest last


class Medians:
    """Online medians of the answers seen so far, by key; a key with too few answers falls
    back to the global median (and max_tokens before any answer)."""

    def __init__(self) -> None:
        self.seen: dict[tuple, deque[int]] = defaultdict(deque)

    def guess(self, name: str, key: tuple, max_tokens: int) -> int:
        values = self.seen.get((name, key))
        if not values or len(values) < 3:
            values = self.seen.get(("global median", ()))
        if not values:
            return max_tokens
        return max(1, min(max_tokens, round(statistics.median(values))))

    def learn(self, name: str, key: tuple, real: int) -> None:
        values = self.seen[name, key]
        values.append(real)
        if len(values) > KEPT[name]:
            values.popleft()


def estimate_errors(args) -> dict[str, dict[str, tuple[float, float]]]:
    """Per slice of the answers (held-apart phrasings, seen phrasings, all): per estimate, its
    median absolute percentage error and share under-estimated by more than half."""
    from apps.admission.estimates import Estimator, Sample
    from worker.protocol import Keys

    estimator = Estimator(Keys(prefix="bench"))
    medians = Medians()
    fired = [0, 0]  # held-apart questions, and those that fired a keyword feature anyway
    parts = ("held", "seen", "novel")
    rows: dict[str, dict[str, list[float]]] = {s: defaultdict(list) for s in parts}
    for i, a in enumerate(workload(args.answers, args.users, args.seed)):
        guess = estimator.guess(
            kind=a.kind,
            user_id=a.user,
            plan=a.plan,
            prompt_tokens=a.prompt,
            max_tokens=a.max_tokens,
            question=a.question,
        )
        keys = {
            "global median": (),
            "median per kind": (a.kind,),
            "median per user": (a.user,),
            "median per kind+user": (a.kind, a.user),
        }
        if a.held_out:  # x[7], x[8]: the keyword features (asks long, asks short)
            fired[0] += 1
            fired[1] += bool(guess.x[7] or guess.x[8])
        if i >= args.warmup:
            row = rows["novel" if a.novel else "held" if a.held_out else "seen"]
            row["learned"].append((guess.tokens - a.real) / a.real)
            for name in BASELINES:
                told = medians.guess(name, keys[name], a.max_tokens)
                row[name].append((told - a.real) / a.real)
            row["max_tokens rule"].append((a.max_tokens - a.real) / a.real)
            row["oracle"].append((a.meant - a.real) / a.real)
        if a.novel:
            continue  # a test set: predicted, never learned from
        estimator.learn([Sample(guess.x, guess.tokens, a.max_tokens, a.user, a.plan, a.real)])
        medians.learn("global median", (), a.real)
        for name in BASELINES[1:]:
            medians.learn(name, keys[name], a.real)
    rows["all"] = {name: [e for part in parts for e in rows[part][name]] for name in rows["held"]}
    print(f"held-apart questions that fire a keyword feature: {fired[1]} of {fired[0]}")
    return {
        part: {
            name: (
                statistics.median(abs(e) for e in errors),
                sum(e < -0.5 for e in errors) / len(errors),
            )
            for name, errors in row.items()
        }
        for part, row in rows.items()
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
    parser.add_argument("--answers", type=int, default=6000)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    results = estimate_errors(args)
    titles = {
        "held": "held-apart phrasings (no keyword of the estimator's lists)",
        "novel": "held-apart phrasings whose core is never learned from",
        "seen": "phrasings the keyword lists were written for",
        "all": "all answers",
    }
    for part, title in titles.items():
        print(f"estimate, {title} (after {args.warmup} answers learned):")
        for name, (ape, under) in sorted(results[part].items(), key=lambda r: r[1][0]):
            print(
                f"  {name:22s} median |error| {ape * 100:6.1f} %   under by > 50 %: "
                f"{under * 100:5.1f} %"
            )
    held = results["held"]
    best = min(BASELINES, key=lambda name: held[name][0])
    ratio = held["learned"][0] / held[best][0]
    every = results["all"]
    overall = every["learned"][0] / min(every[name][0] for name in BASELINES)
    print(
        f"learned / best simple baseline on held-apart phrasings: {ratio:.2f} "
        f"(all answers: {overall:.2f})"
    )
    eta = eta_errors(args)
    print(
        f"eta: median |told - waited| / waited: old rule {eta['rule'] * 100:.0f} %, "
        f"measured per model {eta['measured'] * 100:.0f} %"
    )
    print(
        f"estimates: answer length error {held['learned'][0] * 100:.0f} % learned vs "
        f"{held[best][0] * 100:.0f} % best simple baseline ({best}), vs "
        f"{held['max_tokens rule'][0] * 100:.0f} % max_tokens rule; eta error "
        f"{eta['measured'] * 100:.0f} %"
    )


if __name__ == "__main__":
    main()
