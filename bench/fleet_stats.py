"""bench/fleet.py's search for each policy's goodput, and the intervals over seeds.

Goodput: the highest Poisson arrival rate a policy sustains with TTFT p99 <= 2 s and nothing
lost. From a start rate, steps of 20 % up (or down, when the start fails) find a rate that
passes next to one that fails; halvings of that bracket (geometric) then refine it, to about
20 % / 2^halvings. Time to first token need not grow with load (pull sends fewer requests to
the slow worker once it is full), so the best rate that passed anywhere in the search counts.

Intervals: each seed draws its own arrivals, conversations and prompts, the same for every
policy, so policies are compared seed by seed: the ratio of two policies' goodputs per seed,
its geometric mean over the seeds, and a 95 % interval by Student's t on the log ratios beside
a bootstrap (percentile, 10,000 resamples of the seeds).
"""

from __future__ import annotations

import math
import random
import statistics

TTFT_BOUND_MS = 2000.0
STEP = 1.2


def sustains(figures: dict) -> bool:
    errors = figures["timed_out"] + figures["dropped"] + figures["rejected"]
    return figures["ttft_p99"] <= TTFT_BOUND_MS and errors == 0


def search(simulate, start: float, halvings: int, floor: float = 0.05) -> tuple[float, list]:
    """(goodput, every run's figures); `simulate(rate)` runs the policy at `rate`."""
    tried = []

    def at(rate: float) -> bool:
        found = simulate(rate)
        tried.append(found)
        return sustains(found)

    rate = start
    if at(rate):
        low, high = rate, None
        while high is None:
            rate *= STEP
            if at(rate):
                low = rate
            else:
                high = rate
    else:
        low, high = None, rate
        while low is None and rate > floor:
            rate /= STEP
            if at(rate):
                low = rate
            else:
                high = rate
        if low is None:
            return 0.0, tried
    for _ in range(halvings):
        middle = math.sqrt(low * high)
        if at(middle):
            low = middle
        else:
            high = middle
    passed = [f["rate"] for f in tried if sustains(f)]
    return max(passed, default=0.0), tried


def t_quantile(df: int) -> float:
    """Student's t at 97.5 % for `df` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.975, df))


def mean_interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its 95 % t interval."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = t_quantile(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def ratio_interval(mine: list[float], other: list[float], *, seed: int = 0) -> dict:
    """Paired by seed: the geometric mean of mine / other, its 95 % t interval (on the logs)
    and a bootstrap percentile interval. A seed where either is 0 is left out."""
    logs = [math.log(a / b) for a, b in zip(mine, other, strict=True) if a > 0 and b > 0]
    if not logs:
        return {"ratio": float("nan"), "t": (float("nan"),) * 2, "boot": (float("nan"),) * 2}
    mean, low, high = mean_interval(logs)
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(10_000))
    boot = (means[249], means[9_749])
    return {
        "ratio": math.exp(mean),
        "t": (math.exp(low), math.exp(high)),
        "boot": (math.exp(boot[0]), math.exp(boot[1])),
        "seeds": len(logs),
        "per_seed": [math.exp(v) for v in logs],
    }


def verdict(interval: tuple[float, float]) -> str:
    low, high = interval
    if low <= 1.0 <= high:
        return "no measurable difference"
    return "faster" if low > 1.0 else "slower"
