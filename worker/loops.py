"""Noticing a generation that loops: "how to decide how to decide how to decide…" until the cap.

Small models fall into repeating the same few words, and a repetition penalty only makes it
rarer. The detector reads the answer as it streams, word by word, and reports a loop when the
answer's tail is one unit of words repeated back to back: a unit of `period` words (1 to
`max_period`) repeated at least `min_repeats` times and spanning at least `min_words` words.
The span keeps legitimate repetition alone (a table's separator row, "no, no, no", a short
refrain); the worker then stops the generation and reports finish_reason "loop".
"""

from __future__ import annotations


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
        # Per period p: how many words in a row, ending at the tail, equal the word p before
        # them. Only periods at which the newest word recurs can be non-zero, so each word
        # costs a look at its own recent positions, not at every period.
        self._runs: dict[int, int] = {}
        self._seen_at: dict[str, list[int]] = {}  # word -> its positions in the last periods
        self._needed = {
            p: p * max(min_repeats, -(-min_words // p)) - p for p in range(1, max_period + 1)
        }

    def feed(self, text: str) -> bool:
        if self.looping or not text:
            return self.looping
        joined = self._partial + text
        pieces = joined.split()  # words: runs of non-space
        if not pieces:
            self._partial = ""
            return False
        # A piece not followed by whitespace may be cut: keep it for the next feed.
        complete = not joined[-1].isspace()
        self._partial = pieces.pop() if complete else ""
        for word in pieces:
            if self._add(word.lower()):
                self.looping = True
                break
        return self.looping

    def _add(self, word: str) -> bool:
        """Appends a word; True when the tail now repeats one unit `needed` times over."""
        n = len(self.words)
        self.words.append(word)
        oldest = n - self.max_period
        seen = self._seen_at.get(word)
        if seen is None or seen[-1] < oldest:  # most words: none of the last periods' words
            self._runs = {}
            self._seen_at[word] = [n]
            return False
        positions = [at for at in seen if at >= oldest]
        runs = self._runs
        self._runs = {n - at: runs.get(n - at, 0) + 1 for at in positions}
        positions.append(n)
        self._seen_at[word] = positions
        looping = [p for p, run in self._runs.items() if run >= self._needed[p]]
        if looping:
            self.period = min(looping)
            return True
        return False
