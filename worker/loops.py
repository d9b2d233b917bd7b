"""Noticing a generation that loops: "how to decide how to decide how to decide…" until the cap.

Small models fall into repeating the same few words, and a repetition penalty only makes it
rarer. The detector reads the answer as it streams, word by word, and reports a loop when the
answer's tail is one unit of words repeated back to back: a unit of `period` words (1 to
`max_period`) repeated at least `min_repeats` times and spanning at least `min_words` words.
The span keeps legitimate repetition alone (a table's separator row, "no, no, no", a short
refrain); the worker then stops the generation and reports finish_reason "loop".
"""

from __future__ import annotations

import re

WORD = re.compile(r"\S+")


class LoopDetector:
    """Feed it the answer's text as it streams; `feed` answers True once the answer loops.

    Args:
        min_words: the repeated tail must span at least this many words.
        min_repeats: ... and hold its unit at least this many times.
        max_period: the longest unit looked for, in words (a repeated sentence or two).
    """

    def __init__(self, *, min_words: int = 30, min_repeats: int = 3, max_period: int = 40) -> None:
        self.min_words = min_words
        self.min_repeats = min_repeats
        self.max_period = max_period
        self.words: list[str] = []
        self._partial = ""  # the last word may continue in the next piece of text
        self.looping = False
        self.period = 0  # the repeated unit's length in words, once looping

    def feed(self, text: str) -> bool:
        if self.looping or not text:
            return self.looping
        joined = self._partial + text
        pieces = WORD.findall(joined)
        if not pieces:
            self._partial = ""
            return False
        # A piece not followed by whitespace may be cut: keep it for the next feed.
        complete = not joined[-1].isspace()
        self._partial = pieces.pop() if complete else ""
        for word in pieces:
            self.words.append(word.lower())
            if self._tail_repeats():
                self.looping = True
                break
        return self.looping

    def _tail_repeats(self) -> bool:
        words = self.words
        n = len(words)
        for period in range(1, self.max_period + 1):
            repeats = max(self.min_repeats, -(-self.min_words // period))
            span = period * repeats
            if span > n:
                # Longer periods need longer spans: none of them fits either.
                if period * self.min_repeats > n:
                    break
                continue
            if words[-1] != words[-1 - period]:  # cheap rejection first
                continue
            tail = words[n - span :]
            if all(tail[i] == tail[i % period] for i in range(period, span)):
                self.period = period
                return True
        return False
