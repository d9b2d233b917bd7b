"""The text-aware baselines of bench/estimates.py, online as the estimator is: each answer is
predicted from the answers learned before it.

- `median per template`: the median of the answers to the same phrasing (the template the
  workload made the question from, which no real service knows: a stand-in for a lookup of
  questions seen before), falling back to the median per kind and user, then the global one.
- `bag of words`: a ridge regression of the answer's log tokens on the question's words and
  word pairs (hashed), the kind, the prompt's and the cap's log tokens, refitted every
  `REFIT` answers on the last `WINDOW` learned.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict, deque

REFIT = 200
WINDOW = 4000
FALLBACK_AFTER = 3  # answers a key needs before its own median is used


class Medians:
    """Online medians of the answers seen so far, by (name, key), each name keeping its newest
    `kept[name]`; a key with fewer than FALLBACK_AFTER answers falls back along `fallbacks`."""

    def __init__(self, kept: dict[str, int]) -> None:
        self.kept = kept
        self.seen: dict[tuple, deque[int]] = defaultdict(deque)

    def guess(self, chain: list[tuple[str, tuple]], max_tokens: int) -> int:
        """`chain`: (name, key) to try in order; the global median last of all."""
        for name, key in [*chain, ("global median", ())]:
            values = self.seen.get((name, key))
            if values and len(values) >= FALLBACK_AFTER:
                return max(1, min(max_tokens, round(statistics.median(values))))
        return max_tokens

    def learn(self, name: str, key: tuple, real: int) -> None:
        values = self.seen[name, key]
        values.append(real)
        if len(values) > self.kept[name]:
            values.popleft()


class BagOfWords:
    def __init__(self) -> None:
        from sklearn.feature_extraction.text import HashingVectorizer

        self.vectorizer = HashingVectorizer(
            n_features=2**14, ngram_range=(1, 2), alternate_sign=False, norm="l2"
        )
        self.rows: deque[tuple[str, str, int, int, float]] = deque(maxlen=WINDOW)
        self.model = None
        self.since = 0

    def _x(self, rows):
        from scipy.sparse import csr_matrix, hstack

        words = self.vectorizer.transform([r[0] for r in rows])
        kinds = ("chat", "rag", "long", "background")
        dense = [
            [
                *(float(r[1] == k) for k in kinds),
                math.log1p(r[2]) / 8,
                math.log1p(r[3]) / 8,
            ]
            for r in rows
        ]
        return hstack([words, csr_matrix(dense)]).tocsr()

    def guess(self, *, question: str, kind: str, prompt: int, max_tokens: int) -> int | None:
        if self.model is None:
            return None
        log = self.model.predict(self._x([(question, kind, prompt, max_tokens)]))[0]
        return max(1, min(max_tokens, round(math.exp(min(20.0, log)))))

    def learn(self, *, question: str, kind: str, prompt: int, max_tokens: int, real: int) -> None:
        from sklearn.linear_model import Ridge

        self.rows.append((question, kind, prompt, max_tokens, math.log(max(1, real))))
        self.since += 1
        if self.since >= REFIT or (self.model is None and len(self.rows) >= 30):
            self.since = 0
            rows = list(self.rows)
            self.model = Ridge(alpha=1.0).fit(self._x(rows), [r[4] for r in rows])
