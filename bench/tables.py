"""Writes the README's benchmark table from the recorded runs (bench/record.py): each row is a
benchmark's last line from the newest results file that holds it, with the commit it ran on,
the date and the load average it ran at. A benchmark no recorded run holds keeps the figure
the README had, marked as not from a recorded run.

    .venv/bin/python bench/tables.py            # rewrite README.md's table in place
    .venv/bin/python bench/tables.py --check    # exit 1 if README.md's table is not up to date
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
README = BASE_DIR / "README.md"
RESULTS = BASE_DIR / "bench" / "results"
BEGIN, END = "<!-- bench-table: written by bench/tables.py -->", "<!-- /bench-table -->"
UNRECORDED = " (not from a recorded run)"

# What each benchmark compares, in `make bench`'s order.
COMPARES = {
    "submit": "the web's CPU, wall time, SQL statements and Redis round trips per message",
    "overhead": "the page's websocket path vs the engine's own server, 1-100 streams",
    "openai_overhead": "the OpenAI API vs the upstream driven directly",
    "pages": "a logged-in chat page through the whole middleware chain",
    "connections": "Redis connections of a web process as live streams grow",
    "reconnect": "every page reconnecting at once after a web restart",
    "admission": "admission decisions/s vs Redis's own ceiling with the same script",
    "estimates": "learned answer lengths vs medians per kind, user, kind and user, a median "
    "per phrasing template, a bag-of-words regression and the `max_tokens` rule, on phrasings "
    "nothing learns from (the headline, five seeds) and on phrasings learned from",
    "eta": "queue ETA on the real llama.cpp worker behind 2-4 long answers, on phrasings the "
    "warm-up never taught: what is left at the measured speed vs the moving average of service "
    "time",
    "memory": "facts in five placements kept by the user's statements (their own words) vs a "
    "sliding window, on 40 frozen conversations written by people who never read the rules "
    "(the headline; its misses were read for docs/benchmarks.md's memory steps 12 and 13, where "
    "the unread held-out sets' figures stand) and on "
    "the sets it was tuned on; old values shown as current, current "
    "values shown only as possibly out of date, instruction text, others' statements shown as "
    "the user's",
    "rag": "hit@5 and MRR on 80 questions over `docs/` written by a reader who never saw the "
    "retrieval rules (the headline) and on the 162 it was tuned on; answer among the passages "
    "cited; off-topic questions given passages; the service's search vs exact",
    "demo_ttft": "time to first token on `make run`'s demo: general, follow-up, with passages",
    "engine": "tokens/s through Sluice vs the engine driven directly",
    "engine_vllm": "the same on vLLM's CPU build (when .venv-vllm exists)",
    "fleet": "goodput at TTFT p99 <= 2 s over five seeds with a 95 % interval: pull + affinity "
    "(the dispatcher's own release code in a simulated-time model) vs least connections, "
    "weighted round robin, sticky hashing, a cache-aware balancer with a load bound, pull",
    "load": "capacity of `make run`'s defaults: the highest rate held at TTFT p99 <= 2 s",
}


def recorded(results: Path = RESULTS) -> dict[str, tuple[dict, str]]:
    """bench → (its newest row that ended well and printed a last line, the run's name)."""
    newest: dict[str, tuple[dict, str]] = {}
    for path in sorted(results.glob("*.jsonl")):  # run names sort by date
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line) if line.strip() else {}
            if row.get("status") == 0 and row.get("last_line"):
                newest[row["bench"]] = (row, path.stem)
    return newest


def earlier_cells(text: str) -> dict[str, str]:
    """The last-line cell of each row of the README's table as it stands."""
    cells = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if len(parts) >= 3 and parts[0].startswith("`") and parts[0].strip("`") in COMPARES:
            cells[parts[0].strip("`")] = parts[2]
    return cells


def table(text: str, results: Path = RESULTS) -> str:
    """The table's lines for the README whose table is `text`."""
    rows = recorded(results)
    before = earlier_cells(text)
    lines = ["| bench | compares | last line | run |", "| --- | --- | --- | --- |"]
    for bench, compares in COMPARES.items():
        if bench in rows:
            row, run = rows[bench]
            dirty = " (uncommitted changes)" if row.get("dirty") else ""
            where = (
                f"`{row['command']}` in {run} on `{row['commit']}`{dirty}, load "
                f"{row['load_before']:.1f} -> {row['load_after']:.1f} on {row['cores']} cores"
            )
            lines.append(f"| `{bench}` | {compares} | `{row['last_line']}` | {where} |")
        else:
            cell = before.get(bench, "no figure yet")
            if not cell.endswith(UNRECORDED):
                cell += UNRECORDED
            lines.append(f"| `{bench}` | {compares} | {cell} | - |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = README.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        sys.exit(f"README.md has no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    old, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{table(old)}\n{END}{tail}"
    if args.check:
        if new != text:
            print("README.md's benchmark table is not what bench/results says: run bench/tables.py")
            return 1
        return 0
    README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
