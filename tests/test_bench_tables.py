"""bench/tables.py: the README's table comes from the newest recorded run of each benchmark, and
a figure no run recorded says so."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import tables


def write_run(results: Path, name: str, *rows: dict) -> None:
    base = {"status": 0, "commit": "abc1234", "dirty": False, "command": "bench/x.py"}
    base |= {"load_before": 0.5, "load_after": 1.25, "cores": 2}
    lines = [json.dumps(base | row) for row in rows]
    (results / f"{name}.jsonl").write_text("\n".join(lines) + "\n")


def test_each_row_is_the_newest_run_that_ended_well_and_the_rest_say_they_were_not_recorded(
    tmp_path,
):
    write_run(tmp_path, "2026-12-01T1000", {"bench": "memory", "last_line": "memory: old"})
    write_run(
        tmp_path,
        "2026-12-04T2230",
        {"bench": "memory", "last_line": "memory: new", "commit": "def5678"},
        {"bench": "rag", "last_line": "rag: broken", "status": 1},
    )
    before = "| `rag` | x | `rag: by hand` ¹ | - |\n"
    lines = tables.table(before, tmp_path).splitlines()
    memory = next(line for line in lines if line.startswith("| `memory`"))
    assert "`memory: new`" in memory and "2026-12-04T2230 on `def5678`" in memory
    assert "load 0.5 -> 1.2 on 2 cores" in memory
    rag = next(line for line in lines if line.startswith("| `rag`"))
    assert "`rag: by hand` ¹ (not from a recorded run)" in rag  # the failed run is not used
    # Written again, a row not recorded is not marked twice.
    again = tables.table("\n".join(lines), tmp_path)
    assert again.count("(not from a recorded run)") == "\n".join(lines).count(
        "(not from a recorded run)"
    )
    assert len(lines) == 2 + len(tables.COMPARES)
