"""Answer-length estimates and queue ETAs: the dispatcher's learned figures beside the simple
rules an operator would otherwise run.

    .venv/bin/python bench/estimates.py                  # 6,000 answers, 200 users
    .venv/bin/python bench/estimates.py --answers 20000 --seed 3

1. estimate: a generated workload goes through apps/admission/estimates.py in arrival order,
   each answer predicted before it is learned, as the dispatcher does. Beside it, the same
   answers predicted by online baselines that see the same history: the global median of the
   answers so far, the median per kind, per user and per kind and user; two that read the
   question's text (bench/estimates_text.py): the median per phrasing template and a
   bag-of-words ridge regression refitted as answers come; and the old `max_tokens` rule.
   Printed: the median absolute percentage error and the share under-estimated by more than
   half, over the answers after `--warmup`.

   The workload (bench/estimates_data.py) is not the estimator's own form: questions are
   short, medium or long by what they ask, users have habits (some ask mostly long questions,
   some get wordier answers, in tokens added as well as in proportion), long answers often run
   to the cap, some answers are refusals or clarifications whatever was asked, and background
   summaries sit near their own cap. Three in ten questions are phrased from templates that no
   estimator ever learns from (never-learned: predicted and scored, never taught), with the
   same class-blind openers and tails as the rest; the headline is measured on them. On the
   learned phrasings the per-template median knows each template's answers and is the one to
   beat; on the never-learned ones it falls back to the median per kind and user.
2. eta: the queue ETA told to each waiting request against the wait it really had, on a line
   served by two models of different speeds (a fast one and one 6x slower, with skewed answer
   times): the old rule (one service time for every model, 10 s until it learns) beside the
   per-model service times of apps/admission/servicetimes.py, both through the same formula
   positions.py uses (place over the model's slots, times the service time).

Pure Python, no servers: the same classes the dispatcher runs, fed in the same order;
deterministic for a seed. Prints figures; asserts nothing. The last line gives the
never-learned phrasings' errors (learned, the best baseline, the best text-aware one, the
max_tokens rule), then the learned phrasings' (learned and the best baseline), then the ETA's.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections import defaultdict
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BASE_DIR), str(BASE_DIR / "bench")]

from estimates_data import workload  # noqa: E402
from estimates_text import BagOfWords, Medians  # noqa: E402

MEDIANS = ("global median", "median per kind", "median per user", "median per kind+user")
TEXT = ("median per template", "bag of words")
BASELINES = (*MEDIANS, *TEXT)
KEPT = {
    "global median": 500,
    "median per kind": 300,
    "median per user": 40,
    "median per kind+user": 30,
    "median per template": 60,
}  # answers each median remembers, newest last
SLICES = ("never", "learned")


def estimate_errors(args) -> dict[str, dict[str, tuple[float, float]]]:
    """Per slice of the answers (never-learned phrasings, learned phrasings, all): per
    estimate, its median absolute percentage error and share under-estimated by more than
    half."""
    from apps.admission.estimates import Estimator, Sample
    from contract.protocol import Keys

    estimator = Estimator(Keys(prefix="bench"))
    medians = Medians(KEPT)
    words = BagOfWords()
    rows: dict[str, dict[str, list[float]]] = {s: defaultdict(list) for s in SLICES}
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
            "median per template": (a.template,),
        }
        if i >= args.warmup:
            row = rows["never" if a.never else "learned"]
            row["learned"].append((guess.tokens - a.real) / a.real)
            for name in MEDIANS:
                told = medians.guess([(name, keys[name])], a.max_tokens)
                row[name].append((told - a.real) / a.real)
            chain = [(n, keys[n]) for n in ("median per template", "median per kind+user")]
            told = medians.guess(chain, a.max_tokens)
            row["median per template"].append((told - a.real) / a.real)
            said = words.guess(
                question=a.question, kind=a.kind, prompt=a.prompt, max_tokens=a.max_tokens
            )
            row["bag of words"].append(((said or a.max_tokens) - a.real) / a.real)
            row["max_tokens rule"].append((a.max_tokens - a.real) / a.real)
            row["oracle"].append((a.meant - a.real) / a.real)
        if a.never:
            continue  # predicted, never learned from: by the estimator or any baseline
        estimator.learn([Sample(guess.x, guess.tokens, a.max_tokens, a.user, a.plan, a.real)])
        for name, key in keys.items():
            medians.learn(name, key, a.real)
        words.learn(
            question=a.question, kind=a.kind, prompt=a.prompt, max_tokens=a.max_tokens, real=a.real
        )
    rows["all"] = {name: [e for s in SLICES for e in rows[s][name]] for name in rows["never"]}
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
    from contract.protocol import Keys

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
    parser.add_argument("--seeds", type=int, default=5, help="workloads for the interval")
    args = parser.parse_args()
    results = estimate_errors(args)
    titles = {
        "never": "phrasings never learned from (the headline)",
        "learned": "phrasings learned from, each answer predicted before it is learned",
        "all": "all answers",
    }
    for part, title in titles.items():
        print(f"estimate, {title} (after {args.warmup} answers):")
        for name, (ape, under) in sorted(results[part].items(), key=lambda r: r[1][0]):
            print(
                f"  {name:22s} median |error| {ape * 100:6.1f} %   under by > 50 %: "
                f"{under * 100:5.1f} %"
            )
    never, learned = results["never"], results["learned"]
    best = min(BASELINES, key=lambda name: never[name][0])
    best_learned = min(BASELINES, key=lambda name: learned[name][0])
    mine, theirs = never["learned"][0] / never[best][0], learned["learned"][0]
    print(
        f"learned / best baseline: never-learned phrasings {mine:.2f} ({best}); learned "
        f"phrasings {theirs / learned[best_learned][0]:.2f} ({best_learned})"
    )
    seeds = seeds_summary(args, results)
    eta = eta_errors(args)
    print(
        f"eta: median |told - waited| / waited: old rule {eta['rule'] * 100:.0f} %, "
        f"measured per model {eta['measured'] * 100:.0f} %"
    )
    text = min(TEXT, key=lambda name: never[name][0])
    print(
        f"estimates (never-learned phrasings): answer length error {never['learned'][0] * 100:.0f}"
        f" % learned vs {never[best][0] * 100:.0f} % best baseline ({best}), "
        f"{never[text][0] * 100:.0f} % best text-aware ({text}), "
        f"{never['max_tokens rule'][0] * 100:.0f} % max_tokens rule; on learned phrasings "
        f"{learned['learned'][0] * 100:.0f} % vs {learned[best_learned][0] * 100:.0f} % "
        f"({best_learned}); over {seeds['seeds']} seeds learned / best baseline on "
        f"never-learned {seeds['ratio']:.2f} (95 % interval {seeds['t'][0]:.2f}-"
        f"{seeds['t'][1]:.2f}): {seeds['verdict']}; eta error {eta['measured'] * 100:.0f} %"
    )


def seeds_summary(args, first: dict) -> dict:
    """The never-learned split over --seeds workloads (the first is `first`): each estimate's
    mean error, and the learned one's error over each baseline's, paired by seed, with a 95 %
    t interval on the log ratios (bench/fleet_stats.py)."""
    from fleet_stats import ratio_interval

    errors = [{n: e[0] for n, e in first["never"].items()}]
    for seed in range(args.seed + 1, args.seed + args.seeds):
        found = estimate_errors(argparse.Namespace(**{**vars(args), "seed": seed}))
        errors.append({n: e[0] for n, e in found["never"].items()})
    last = args.seed + len(errors) - 1
    print(f"never-learned phrasings over {len(errors)} seeds ({args.seed}-{last}):")
    names = sorted(errors[0], key=lambda n: statistics.fmean(e[n] for e in errors))
    mine = [e["learned"] for e in errors]
    best = min(BASELINES, key=lambda n: statistics.fmean(e[n] for e in errors))
    summary = {}
    for name in names:
        mean = statistics.fmean(e[name] for e in errors)
        line = f"  {name:22s} mean median |error| {mean * 100:6.1f} %"
        if name in BASELINES:
            r = ratio_interval(mine, [e[name] for e in errors])
            line += f"   learned / it {r['ratio']:.2f} (95 % {r['t'][0]:.2f}-{r['t'][1]:.2f})"
            if name == best:
                low, high = r["t"]
                verdict = (
                    "no measurable difference"
                    if low <= 1 <= high
                    else "learned better"
                    if high < 1
                    else "learned worse"
                )
                summary = {**r, "seeds": len(errors), "best": best, "verdict": verdict}
        print(line)
    return summary


if __name__ == "__main__":
    main()
