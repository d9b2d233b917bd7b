"""Runs one benchmark and files its last line in the dated results file of a run, with the
commit it ran on and the machine's load average before and after it (the machines are shared:
a figure measured beside other work is marked by its load).

    .venv/bin/python bench/record.py bench/memory.py --summaries none
    BENCH_RUN=2026-12-04T2230 .venv/bin/python bench/record.py bench/rag.py  # as `make bench`
    .venv/bin/python bench/record.py --python .venv-vllm/bin/python --name engine_vllm \
        bench/engine.py --engine vllm

`make bench` runs every benchmark through this with one BENCH_RUN, so a run's rows share one
file: bench/results/<BENCH_RUN>.jsonl (BENCH_RUN defaults to now, UTC). bench/tables.py
writes the README's table from such a file. The benchmark's output passes through as it
comes; the exit status is the benchmark's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
RESULTS = BASE_DIR / "bench" / "results"
# A benchmark's summary line: its name, an optional set in brackets, a colon ("memory
# (independent, headline): ...").
LAST_LINE = re.compile(r"^[a-z_]+(?: \([^)]*\))?: ")


def git(*args: str) -> str:
    run = subprocess.run(["git", *args], cwd=BASE_DIR, capture_output=True, text=True)
    return run.stdout.strip()


def run_id() -> str:
    return os.environ.get("BENCH_RUN") or datetime.now(UTC).strftime("%Y-%m-%dT%H%M")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter to run it")
    parser.add_argument("--name", default="", help="the row's name (default: the script's)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="bench/NAME.py [ARGUMENTS]")
    args = parser.parse_args()
    command = args.command
    if not command or not command[0].endswith(".py"):
        parser.error("give the benchmark: bench/NAME.py [ARGUMENTS]")
    load_before = os.getloadavg()[0]
    started = time.time()
    process = subprocess.Popen(
        [args.python, *command], cwd=BASE_DIR, stdout=subprocess.PIPE, text=True, bufsize=1
    )
    last = ""
    for line in process.stdout:
        sys.stdout.write(line)
        if LAST_LINE.match(line):
            last = line.rstrip("\n")
    status = process.wait()
    row = {
        "bench": args.name or Path(command[0]).stem,
        "command": " ".join(command),
        "last_line": last,
        "status": status,
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "started": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
        "seconds": round(time.time() - started, 1),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "cores": os.cpu_count(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{run_id()}.jsonl"
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(row) + "\n")
    print(f"[record] {row['bench']}: filed in {path.relative_to(BASE_DIR)}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
