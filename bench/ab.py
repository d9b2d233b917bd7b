"""One benchmark on two trees, side by side: run alternately on another commit's tree and on
this checkout, several pairs, then each figure of the benchmark's last line as the mean of
each side. On a shared machine one run moves by more than most changes do (the overhead bench's
CPU per answer by a millisecond from one run to the next): alternating pairs and averaging them
is what tells a change from the noise.

    .venv/bin/python bench/ab.py REV BENCH [--pairs 3] [-- BENCH'S ARGUMENTS]

e.g. `.venv/bin/python bench/ab.py b718cf5 overhead --pairs 5 -- --clients 100`. The other tree
is a git worktree under var/bench/ (made once per commit, kept); both sides run with this
checkout's virtualenv. Last line:
`ab: <the last line, each figure as before -> after> (N pairs)`.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def worktree(rev: str) -> Path:
    """The tree of `rev`, checked out under var/bench/ once."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", rev],
        cwd=BASE_DIR,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    path = BASE_DIR / "var" / "bench" / f"ab-{commit}"
    if not path.exists():
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(path), commit],
            cwd=BASE_DIR,
            check=True,
            capture_output=True,
        )
    return path


def last_line(tree: Path, bench: str, args: list[str]) -> str:
    """Runs the bench in `tree`; its last line that starts with a name and a colon."""
    run = subprocess.run(
        [sys.executable, f"bench/{bench}.py", *args], cwd=tree, capture_output=True, text=True
    )
    lines = [line for line in run.stdout.splitlines() if re.match(r"^[a-z_]+: ", line)]
    if run.returncode != 0 or not lines:
        sys.exit(
            f"bench/{bench}.py failed in {tree} (exit {run.returncode}):\n{run.stderr[-2000:]}"
        )
    return lines[-1]


def side_by_side(before: list[str], after: list[str]) -> str:
    """The last line with each figure as `mean before -> mean after` (written as the bench
    writes it: its sign, its decimals); the lines must share their words (the same bench, the
    same arguments)."""
    template = NUMBER.sub("{}", after[0])
    if any(NUMBER.sub("{}", line) != template for line in before + after):
        return "the two trees print different last lines: " + " | ".join((before[0], after[0]))
    columns_before = list(zip(*(NUMBER.findall(line) for line in before), strict=True))
    columns_after = list(zip(*(NUMBER.findall(line) for line in after), strict=True))
    figures = []
    for old, new in zip(columns_before, columns_after, strict=True):
        shown = [_written_as(old + new, statistics.mean(map(float, side))) for side in (old, new)]
        figures.append(shown[0] if shown[0] == shown[1] else f"{shown[0]} -> {shown[1]}")
    return template.format(*figures)


def _written_as(samples: tuple[str, ...], value: float) -> str:
    decimals = max(len(x.partition(".")[2]) for x in samples)
    sign = "+" if any(x.startswith("+") for x in samples) else ""
    return f"{value:{sign}.{decimals}f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Arguments after -- go to the bench."
    )
    parser.add_argument("rev", help="the commit to compare this checkout with")
    parser.add_argument("bench", help="a script in bench/, without .py (e.g. overhead)")
    parser.add_argument("--pairs", type=int, default=3)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)  # after --: the bench's own
    args, bench_args = parser.parse_args(argv[:split]), argv[split + 1 :]
    other = worktree(args.rev)
    before, after = [], []
    for pair in range(1, args.pairs + 1):
        before.append(last_line(other, args.bench, bench_args))
        print(f"[ab] pair {pair} before ({args.rev}): {before[-1]}", flush=True)
        after.append(last_line(BASE_DIR, args.bench, bench_args))
        print(f"[ab] pair {pair} after (this checkout): {after[-1]}", flush=True)
    print(f"ab: {side_by_side(before, after)} ({args.pairs} pairs)")


if __name__ == "__main__":
    main()
