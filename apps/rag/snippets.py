"""What a passage shows of itself: its title beside its section, and a snippet around the
words it shares with the question."""

from __future__ import annotations

import re

from apps.rag.chunking import HEADING_SEPARATOR


def display_title(title: str, heading: str) -> str:
    section = heading.split(HEADING_SEPARATOR)[-1] if heading else ""
    return f"{title}{HEADING_SEPARATOR}{section}" if section and section != title else title


WORD = re.compile(r"\w{4,}", re.UNICODE)


def snippet(text: str, query: str, *, width: int = 240) -> str:
    """About `width` characters of `text`, around the first word it shares with `query`."""
    flat = " ".join(text.split())
    flat = re.sub(r"^#{1,6} ", "", flat)
    if len(flat) <= width:
        return flat
    start = 0
    lowered = flat.lower()
    positions = [lowered.find(w.lower()) for w in WORD.findall(query)]
    positions = [p for p in positions if p > 0]
    if positions:
        start = max(0, min(positions) - width // 3)
        if start:
            space = flat.find(" ", start)
            start = space + 1 if 0 <= space < start + 30 else start
    end = min(len(flat), start + width)
    if end < len(flat):
        space = flat.rfind(" ", start + width // 2, end)
        end = space if space > 0 else end
    return ("…" if start else "") + flat[start:end].strip() + ("…" if end < len(flat) else "")
