"""bench/fleet.py's tables and its last line."""

from __future__ import annotations

from fleet_model import BEFORE, IDEAL
from fleet_stats import mean_interval, ratio_interval, verdict

MINE = "affinity"
REFERENCES = (BEFORE, IDEAL)


def _speed(prefill_ms: float) -> str:
    return f"x{0.4 / prefill_ms:g}"


def seeds_table(rows: list[dict], policies: list[str], fleet, seeds: list[int]) -> dict:
    """Goodput per seed and its mean with a 95 % interval; affinity against each other policy,
    paired by seed. Returns what the last line says."""
    found = {(r["policy"], r["seed"]): r["goodput"] for r in rows}
    print(
        f"\ngoodput, req/s at ttft p99 <= 2 s with nothing timed out or dropped, kv "
        f"{fleet.kv_tokens // 1000}k, prefill {_speed(fleet.prefill_ms)}, {len(seeds)} seeds:"
    )
    print(f"{'policy':<15}" + "".join(f"{f's{s}':>7}" for s in seeds) + "    mean  95 % interval")
    means = {}
    for policy in policies:
        values = [found.get((policy, s), 0.0) for s in seeds]
        mean, low, high = mean_interval(values)
        means[policy] = mean
        print(
            f"{policy:<15}"
            + "".join(f"{v:>7.2f}" for v in values)
            + f"{mean:>8.2f}  {low:.2f}-{high:.2f}"
        )
    mine = [found.get((MINE, s), 0.0) for s in seeds]
    print(f"\n{MINE} / each policy, paired by seed: geometric mean, 95 % t and bootstrap intervals")
    ratios = {}
    for policy in policies:
        if policy == MINE:
            continue
        other = [found.get((policy, s), 0.0) for s in seeds]
        r = ratio_interval(mine, other)
        ratios[policy] = r
        if r["ratio"] != r["ratio"]:  # nan: a policy with no goodput at all
            print(f"{policy:<15} (no goodput to compare with)")
            continue
        print(
            f"{policy:<15}{r['ratio']:>6.3f}x  t {r['t'][0]:.3f}-{r['t'][1]:.3f}  "
            f"bootstrap {r['boot'][0]:.3f}-{r['boot'][1]:.3f}  {verdict(r['t'])}"
        )
    others = [p for p in policies if p not in (MINE, *REFERENCES)]
    if MINE not in means or not others:
        return {}
    best = max(others, key=means.__getitem__)
    return {
        "best": best,
        "mine": means[MINE],
        "other": means[best],
        "interval": ratios[best],
        "seeds": len(seeds),
    }


def grid_table(rows, policies, grid, olds, seed: int) -> None:
    print(f"\ngoodput, req/s, one seed ({seed}), by cache size and prefill speed:")
    columns = [(s, "question") for s in grid] + [(s, "system") for s in olds]
    names = [
        f"{s.kv_tokens // 1000}k {_speed(s.prefill_ms)}" + (" old" if lay == "system" else "")
        for s, lay in columns
    ]
    print(f"{'policy':<15}" + "".join(f"{n:>12}" for n in names))
    found = {
        (r["policy"], r["kv"], r["prefill"], r["layout"]): r["goodput"]
        for r in rows
        if r["seed"] == seed
    }
    for policy in policies:
        cells = [found.get((policy, s.kv_tokens, s.prefill_ms, lay), 0) for s, lay in columns]
        print(f"{policy:<15}" + "".join(f"{c:>12.2f}" for c in cells))
    print(
        "(kv: prefix-cache tokens per worker; x1 / x4: prefill 0.4 / 0.1 ms per token; old: "
        "passages in the system message, the previous layout)"
    )


def common_table(rows: list[dict], fleet) -> None:
    print(
        f"\nat {rows[0]['rate']:.2f} req/s, kv {fleet.kv_tokens // 1000}k, prefill "
        f"{_speed(fleet.prefill_ms)}, the first seed:"
    )
    print(
        f"{'policy':<15}{'ttft p50':>10}{'ttft p99':>10}{'cache hit':>11}"
        f"{'prompt':>8}{'asked':>7}{'done':>6}{'timeout':>8}{'dropped':>8}"
    )
    for r in rows:
        print(
            f"{r['policy']:<15}{r['ttft_p50']:>8.0f}ms{_ms(r['ttft_p99']):>10}"
            f"{r['hit']:>10.0%} {r['prompt_tokens']:>7.0f}{r['asked']:>7}{r['done']:>6}"
            f"{r['timed_out']:>8}{r['dropped']:>8}"
        )


def _ms(value: float) -> str:
    return "lost" if value == float("inf") else f"{value:.0f}ms"


def headline(summary: dict, common: list[dict]) -> str:
    if not summary:
        return ""
    hits = {r["policy"]: r["hit"] for r in common}
    r, best = summary["interval"], summary["best"]
    return (
        f"fleet: goodput at ttft p99 <= 2 s over {summary['seeds']} seeds: affinity "
        f"{summary['mine']:.2f} req/s, best other {best} {summary['other']:.2f} req/s, "
        f"{r['ratio']:.2f}x (95 % interval {r['t'][0]:.2f}-{r['t'][1]:.2f}): "
        f"{verdict(r['t'])}; prefix cache hits {100 * hits.get(MINE, 0):.0f} % vs "
        f"{100 * hits.get(best, 0):.0f} %"
    )
