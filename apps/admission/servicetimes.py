"""Service times measured per model: how long a worker takes from starting an answer to its
final event, as a moving average over the answers that model's workers gave. Positions turn
them into ETAs: a request at place p of a model's line, served by s slots, starts in about
p / s times the model's service time.

One figure for every model (the old rule) is wrong for all of them when a fast and a slow
model share the fleet; so is a figure that starts from a guess again on every failover. These
are kept per model, in Redis under the dispatcher's hash tag, written as answers settle.
"""

from __future__ import annotations

import redis

from worker.protocol import ADMISSION_STATE_TTL_SECONDS, Answer, Keys

DECAY = 0.8  # weight of the previous average at each answer
DEFAULT_SECONDS = 10.0  # before any answer of any model has been measured


class ServiceTimes:
    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.seconds: dict[str, tuple[float, int]] = {}  # model → (average, answers)
        self._changed: set[str] = set()

    def learn(self, model: str, seconds: float) -> None:
        if seconds <= 0:
            return
        known = self.seconds.get(model)
        average = seconds if known is None else DECAY * known[0] + (1 - DECAY) * seconds
        self.seconds[model] = (average, (known[1] if known else 0) + 1)
        self._changed.add(model)

    def learn_answer(self, model: str, answer: Answer) -> None:
        """An answer that ran (stopped or failed ones too: they held a slot that long)."""
        duration = answer.usage.duration_ms
        if answer.attempt and duration:
            self.learn(model, float(duration) / 1000)

    def of(self, model: str) -> float:
        """The model's service time; before it has one, the average over the models that do
        (weighted by answers), else DEFAULT_SECONDS."""
        known = self.seconds.get(model)
        if known is not None:
            return known[0]
        total = sum(n for _, n in self.seconds.values())
        if not total:
            return DEFAULT_SECONDS
        return sum(s * n for s, n in self.seconds.values()) / total

    def eta(self, model: str, *, place: int, slots: int) -> float:
        """Seconds until the request at `place` in `model`'s line starts."""
        return place / max(1, slots) * self.of(model)

    def overall(self) -> float:
        return self.of("\0")  # no model has this name: the weighted average

    def save(self, pipe) -> None:
        if self._changed:
            pipe.hset(
                self.keys.estimates("service"),
                mapping={m: "{:.4f},{}".format(*self.seconds[m]) for m in self._changed},
            )
            pipe.expire(self.keys.estimates("service"), ADMISSION_STATE_TTL_SECONDS)
            self._changed.clear()

    def load(self, client: redis.Redis) -> None:
        self.seconds.clear()
        self._changed.clear()
        for model, value in client.hgetall(self.keys.estimates("service")).items():
            seconds, _, count = value.partition(",")
            try:
                self.seconds[model] = (float(seconds), int(count))
            except ValueError:
                continue  # relearned from the next answers
