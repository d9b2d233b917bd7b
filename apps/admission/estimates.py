"""Answer lengths, learned online: how many tokens a request's answer will take, predicted from
what the dispatcher sees when it arrives and corrected by every answer's real usage.

The old rule reserved `max_tokens` for every answer (a chat's cap is 512; most answers take a
tenth of it), so the buckets held back tokens a user never spent and the fair queue weighed a
"yes" like an essay. The prediction is a ridge regression on the logarithm of the answer's
tokens, refitted after each batch of answers, over features that are cheap to read at intake:

    the kind (rag, long, background; chat is the baseline), the prompt's tokens, the question's
    length and max_tokens;

plus how much longer or shorter than predicted the recent answers of this user and of this plan
have been: a lean per user and per plan (in log tokens), moved towards each answer's error; and
a weight per word of the question (hashed into `WORD_BUCKETS`), learned from the answers the same
way. No list of words decides what asks for a long answer: the answers teach it, in whatever
words people use (bench/estimates.py scores it on phrasings it never learns from; the keyword
lists this replaced did no better there).

The statistics decay (`DECAY` per answer), so the model follows a workload that changes. Until
`MIN_SAMPLES` answers are learned it predicts `max_tokens`, the old rule. The prediction never
exceeds `max_tokens`; the difference to the real usage is refunded or charged on completion.

The state lives in Redis under the dispatcher's hash tag and is written with each batch of
answers it learns from, so a standby dispatcher that takes over predicts as well as the one
before it. Recent errors (predicted against real, and the old rule's beside them) are kept too:
their median absolute percentage error and the share under-estimated by more than half are the
gauges /metrics and the operations page show.
"""

from __future__ import annotations

import json
import math
import statistics
import time
import zlib
from collections import deque
from dataclasses import dataclass

import redis

from apps.admission.kinds import BACKGROUND, LONG, RAG
from contract.protocol import ADMISSION_STATE_TTL_SECONDS, Keys

FEATURES = ("bias", "rag", "long", "background", "prompt", "question", "max_tokens")
# The previous release's model had two more dense features after these (keyword flags): its
# statistics for the features kept are the leading rows and columns, read as they are.
PREVIOUS_FEATURES = len(FEATURES) + 2
DECAY = 0.998  # per answer learned: the last ~500 answers weigh most
RIDGE = 1.0
MIN_SAMPLES = 30
USER_RATE = 0.25  # how far one answer moves its user's lean (in log tokens)
PLAN_RATE = 0.05  # and its plan's
ERRORS_KEPT = 1000
SAVE_SECONDS = 1.0  # what was learned is written to Redis at most this often
QUESTION_CHARS = 2000  # what the text features read of the question (its start)
WORD_BUCKETS = 1024  # words of the question, hashed; each bucket has a learned weight
WORDS_READ = 32  # distinct words (buckets) read of a question, from its start
WORD_RATE = 0.1  # how far one answer moves the weights of its words (in log tokens, all told)
_PUNCTUATION = str.maketrans({c: " " for c in "?.,;:!\"'()"})
_USER_MARK = '"role": "user", "content": "'


def question_of(messages: str) -> str:
    """The last user message of a work item's `messages` JSON, roughly (escapes left as they
    are): read with a search instead of decoding the whole prompt on the admission path."""
    # The question is most often the last message: look near the end first.
    at = messages.rfind(_USER_MARK, max(0, len(messages) - 2 * QUESTION_CHARS))
    if at < 0:
        at = messages.rfind(_USER_MARK)
    if at < 0:
        return ""
    start = at + len(_USER_MARK)
    end = messages.find('"}', start)
    return messages[start : end if end >= 0 else None]


@dataclass(slots=True)
class Guess:
    tokens: int  # the answer's predicted tokens: what its buckets reserve
    x: list[float]  # the features it was made from: what its answer teaches


@dataclass(slots=True)
class Sample:
    """A settled answer, with what was predicted for it."""

    x: list[float]
    guessed: int
    max_tokens: int
    user_id: str
    plan: str
    real: int  # completion tokens


@dataclass
class ErrorStats:
    samples: int = 0
    median_ape: float | None = None  # median |predicted - real| / real
    under_half: float | None = None  # share predicted < half the real length
    rule_median_ape: float | None = None  # the same for the old rule (max_tokens)
    rule_under_half: float | None = None

    def gauges(self) -> dict[str, float]:
        """The metrics hash's fields (missing figures are left out)."""
        named = {
            "estimate_samples": self.samples,
            "estimate_median_ape": self.median_ape,
            "estimate_under_half": self.under_half,
            "estimate_rule_median_ape": self.rule_median_ape,
            "estimate_rule_under_half": self.rule_under_half,
        }
        return {f"gauge:{k}": round(v, 4) for k, v in named.items() if v is not None}


def error_stats(errors) -> ErrorStats:
    """`errors`: (learned, rule) signed relative errors, (predicted - real) / real."""
    errors = list(errors)
    if not errors:
        return ErrorStats()
    learned = [e for e, _ in errors]
    rule = [r for _, r in errors]
    return ErrorStats(
        samples=len(errors),
        median_ape=statistics.median(abs(e) for e in learned),
        under_half=sum(e < -0.5 for e in learned) / len(learned),
        rule_median_ape=statistics.median(abs(r) for r in rule),
        rule_under_half=sum(r < -0.5 for r in rule) / len(rule),
    )


class Estimator:
    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.reset()

    def reset(self) -> None:
        size = len(FEATURES)
        self.a = [[RIDGE if i == j else 0.0 for j in range(size)] for i in range(size)]
        self.b = [0.0] * size
        self.w = [0.0] * size
        self.samples = 0
        self.plans: dict[str, float] = {}  # plan → its lean
        self.words = [0.0] * WORD_BUCKETS  # word bucket → its weight
        self.users: dict[str, float] = {}
        self.errors: deque[tuple[float, float]] = deque(maxlen=ERRORS_KEPT)
        self._dirty_users: set[str] = set()
        self._new_errors: list[tuple[float, float]] = []
        self._saved_at = float("-inf")

    # -- predicting ------------------------------------------------------------------------------

    def guess(
        self,
        *,
        kind: str,
        user_id: str,
        plan: str,
        prompt_tokens: int,
        max_tokens: int,
        question: str,
    ) -> Guess:
        x = self.features(
            kind=kind,
            user_id=user_id,
            plan=plan,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            question=question,
        )
        if self.samples < MIN_SAMPLES:
            return Guess(max_tokens, x)
        predicted = math.exp(min(20.0, self._log_tokens(x, user_id, plan)))
        return Guess(max(1, min(max_tokens, round(predicted))), x)

    def _log_tokens(self, x: list[float], user_id: str, plan: str) -> float:
        shared = sum(w * v for w, v in zip(self.w, x[: len(FEATURES)], strict=True))
        leans = self.users.get(user_id, 0.0) + self.plans.get(plan, 0.0)
        return shared + leans + self._words(x)[1]

    def features(
        self,
        *,
        kind: str,
        user_id: str,
        plan: str,
        prompt_tokens: int,
        max_tokens: int,
        question: str,
    ) -> list[float]:
        words = question[:QUESTION_CHARS].lower().translate(_PUNCTUATION).split()
        # After the dense features, the question's word buckets: they travel with the work
        # item as the rest do, so the answer can teach their weights.
        return [
            1.0,
            float(kind == RAG),
            float(kind == LONG),
            float(kind == BACKGROUND),
            math.log1p(max(0, prompt_tokens)) / 8,
            math.log1p(len(question)) / 8,
            math.log1p(max(1, max_tokens)) / 8,
            *_buckets(words),
        ]

    def _words(self, x: list[float]) -> tuple[list[int], float]:
        """The word buckets of features `x`, and their share of the prediction."""
        buckets = [int(v) for v in x[len(FEATURES) :] if 0 <= v < WORD_BUCKETS]
        if not buckets:
            return buckets, 0.0
        return buckets, sum(self.words[b] for b in buckets) / math.sqrt(len(buckets))

    # -- learning --------------------------------------------------------------------------------

    def learn(self, samples: list[Sample]) -> None:
        if not samples:
            return
        for sample in samples:
            if len(sample.x) < len(FEATURES) or sample.real <= 0:
                continue
            y = math.log(sample.real)
            user, plan = self.users.get(sample.user_id, 0.0), self.plans.get(sample.plan, 0.0)
            buckets, said = self._words(sample.x)
            # The leans and the word weights move by this answer's error; the shared model
            # learns what is left of the answer once they are taken out.
            error = y - self._log_tokens(sample.x, sample.user_id, sample.plan)
            self.users[sample.user_id] = user + USER_RATE * error
            self.plans[sample.plan] = plan + PLAN_RATE * error
            for b in buckets:
                self.words[b] += WORD_RATE * error / math.sqrt(len(buckets))
            self._dirty_users.add(sample.user_id)
            target = y - user - plan - said
            dense = sample.x[: len(FEATURES)]
            for i, xi in enumerate(dense):
                row = self.a[i]
                for j, xj in enumerate(dense):
                    row[j] = DECAY * row[j] + xi * xj
                self.b[i] = DECAY * self.b[i] + xi * target
            self.samples += 1
            error = (
                (sample.guessed - sample.real) / sample.real,
                (sample.max_tokens - sample.real) / sample.real,
            )
            self.errors.append(error)
            self._new_errors.append(error)
        self.w = _solve(
            [
                [v + (RIDGE if i == j else 0.0) for j, v in enumerate(row)]
                for i, row in enumerate(self.a)
            ],
            self.b,
        )

    def stats(self) -> ErrorStats:
        return error_stats(self.errors)

    # -- Redis -----------------------------------------------------------------------------------

    def due(self) -> bool:
        """Something learned is unsaved, and the last save is SAVE_SECONDS old."""
        unsaved = self._new_errors or self._dirty_users
        return bool(unsaved) and time.monotonic() - self._saved_at >= SAVE_SECONDS

    def save(self, pipe, *, force: bool = False) -> None:
        """Writes what changed since the last save (on the caller's pipeline) when it is due,
        or at once with `force` (a lease given up): the model and the error figures are
        rewritten whole, and the recorder settles a batch of answers many times a second."""
        if not (self._new_errors or self._dirty_users) or not (force or self.due()):
            return
        self._saved_at = time.monotonic()
        k = self.keys
        words = [round(v, 4) for v in self.words]
        model = {"a": self.a, "b": self.b, "n": self.samples, "plans": self.plans, "words": words}
        pipe.set(k.estimates("model"), json.dumps(model), ex=ADMISSION_STATE_TTL_SECONDS)
        if self._dirty_users:
            pipe.hset(
                k.estimates("users"), mapping={u: f"{self.users[u]:.5f}" for u in self._dirty_users}
            )
            pipe.expire(k.estimates("users"), ADMISSION_STATE_TTL_SECONDS)
        if self._new_errors:
            pipe.lpush(k.estimates("errors"), *(f"{e:.4f},{r:.4f}" for e, r in self._new_errors))
            pipe.ltrim(k.estimates("errors"), 0, ERRORS_KEPT - 1)
            pipe.expire(k.estimates("errors"), ADMISSION_STATE_TTL_SECONDS)
            pipe.hset(k.metrics, mapping=self.stats().gauges())
        self._dirty_users.clear()
        self._new_errors = []

    def load(self, client: redis.Redis) -> None:
        """What the previous lease holder learned (a fresh start when there is nothing, or
        when it cannot be read)."""
        self.reset()
        pipe = client.pipeline(transaction=False)
        pipe.get(self.keys.estimates("model"))
        pipe.hgetall(self.keys.estimates("users"))
        pipe.lrange(self.keys.estimates("errors"), 0, ERRORS_KEPT - 1)
        raw, users, errors = pipe.execute()
        try:
            if raw:
                model = json.loads(raw)
                size = len(FEATURES)
                a, b = model["a"], model["b"]
                if len(b) == PREVIOUS_FEATURES and len(a) == PREVIOUS_FEATURES:
                    a, b = [row[:size] for row in a[:size]], b[:size]
                if len(b) == size and len(a) == size and all(len(r) == size for r in a):
                    self.a = [[float(v) for v in row] for row in a]
                    self.b = [float(v) for v in b]
                    self.samples = int(model["n"])
                    self.plans = {str(p): float(v) for p, v in model["plans"].items()}
                    words = model.get("words") or []  # absent in state saved before them
                    if len(words) == WORD_BUCKETS:
                        self.words = [float(v) for v in words]
                    self.w = _solve(
                        [
                            [v + (RIDGE if i == j else 0.0) for j, v in enumerate(row)]
                            for i, row in enumerate(self.a)
                        ],
                        self.b,
                    )
            self.users = {user: float(value) for user, value in users.items()}
            for value in reversed(errors):
                learned, _, rule = value.partition(",")
                self.errors.append((float(learned), float(rule)))
        except (ValueError, TypeError, KeyError):
            self.reset()  # a model that cannot be read is relearned, never trusted


def _buckets(words: list[str]) -> list[float]:
    """The distinct hashed buckets of `words`, from the first, at most WORDS_READ of them
    (crc32, not hash(): every process must put a word in the same bucket)."""
    found: list[float] = []
    for word in words:
        bucket = float(zlib.crc32(word.encode()) % WORD_BUCKETS)
        if bucket not in found:
            found.append(bucket)
            if len(found) == WORDS_READ:
                break
    return found


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """x with a·x = b, by Gaussian elimination with partial pivoting (a is positive definite:
    the ridge keeps it so)."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) < 1e-12:
            continue
        for r in range(col + 1, n):
            factor = m[r][col] / m[col][col]
            if factor:
                for c in range(col, n + 1):
                    m[r][c] -= factor * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        if abs(m[r][r]) < 1e-12:
            continue
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x
