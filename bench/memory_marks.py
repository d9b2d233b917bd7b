"""How loosely memory marks a line as earlier ("a later line may replace it"), on the written
tuning sets, at the product's thresholds and at higher ones: lines marked earlier, how many of
them name a labelled old value (a correction the set's writer wrote down), and how many
labelled corrections have every line naming their old value marked (what a higher bar loses).
No model, under a minute a setting.

    .venv/bin/python bench/memory_marks.py [--same-subject 0.3,0.4,0.5] [--tuning-files F,...]

Last line: `memory_marks: at SAME_SUBJECT <v>: <n> lines marked earlier, <m> name a labelled old
value, <k> of <c> corrections found; ...`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")

import django  # noqa: E402

django.setup()

from memory_data import TUNING  # noqa: E402

from apps.chat.prompt import memory_facts as facts  # noqa: E402
from apps.chat.prompt import memory_replaced as replaced  # noqa: E402
from apps.chat.selectors import Turn  # noqa: E402


def marks(conversations: list[dict]) -> tuple[int, int, int, int]:
    """(lines marked earlier, of them naming a labelled old value, corrections whose every
    line naming the old value is marked, corrections)."""
    marked = naming_old = found = corrections = 0
    for conversation in conversations:
        turns = [Turn(n, t["role"], t["text"]) for n, t in enumerate(conversation["turns"], 1)]
        facts.statements_forget()  # each setting reads the turns afresh
        entries = facts.merge([], turns, newer=lambda turn_id, than: turn_id > than)
        olds = [f["old"].lower() for f in conversation["facts"] if f.get("old")]
        for entry in entries:
            if entry.later:
                marked += 1
                naming_old += any(old in entry.text().lower() for old in olds)
        for old in olds:
            corrections += 1
            holders = [e for e in entries if old in e.text().lower()]
            found += bool(holders) and all(e.later for e in holders)
    return marked, naming_old, found, corrections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--same-subject", default=f"{replaced.SAME_SUBJECT},0.4,0.5")
    parser.add_argument("--tuning-files", default="", help="comma-separated; all by default")
    args = parser.parse_args()
    chosen = {name.strip() for name in args.tuning_files.split(",") if name.strip()}
    paths = [p for p in TUNING if not chosen or p.name in chosen]
    if not paths:
        parser.error(f"--tuning-files: none of {', '.join(sorted(chosen))} in bench/data/")
    conversations = [
        json.loads(line)
        for path in paths
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    print(f"{len(conversations)} conversations from {', '.join(p.name for p in paths)}")
    product = replaced.SAME_SUBJECT
    parts = []
    for value in (float(v) for v in args.same_subject.split(",")):
        replaced.SAME_SUBJECT = value
        marked, naming_old, found, corrections = marks(conversations)
        label = " (the product's)" if value == product else ""
        print(
            f"  SAME_SUBJECT {value}{label}: {marked} lines marked earlier, {naming_old} name a "
            f"labelled old value; {found} of {corrections} corrections found",
            flush=True,
        )
        parts.append(
            f"at SAME_SUBJECT {value}: {marked} lines marked earlier, {naming_old} name a "
            f"labelled old value, {found} of {corrections} corrections found"
        )
    replaced.SAME_SUBJECT = product
    print("memory_marks: " + "; ".join(parts))


if __name__ == "__main__":
    main()
