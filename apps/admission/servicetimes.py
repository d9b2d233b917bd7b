"""What the workers' answers measured, per model: how long an answer takes from its start to
its final event (a moving average, the old ETA's only figure and the ops page's), and how fast
one answer decodes and how long the rest of its time in a slot takes (moving averages too: the
ETA's figures, see positions.py).

One figure for every model is wrong for all of them when a fast and a slow model share the
fleet; so is a figure that starts from a guess again on every failover. These are kept per
model, in Redis under the dispatcher's hash tag, written as answers settle.
"""

from __future__ import annotations

import redis

from contract.protocol import ADMISSION_STATE_TTL_SECONDS, Answer, Keys

DECAY = 0.8  # weight of the previous average at each answer
DEFAULT_SECONDS = 10.0  # before any answer of any model has been measured
# Fewer tokens than this say more about the engine's start than about its speed.
SPEED_MIN_TOKENS = 8


class ServiceTimes:
    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.seconds: dict[str, tuple[float, int]] = {}  # model → (average, answers)
        # model → (tokens per second of one answer, seconds of its slot's time not spent
        # decoding, answers)
        self.speeds: dict[str, tuple[float, float, int]] = {}
        self._changed: set[str] = set()
        self._speeds_changed: set[str] = set()

    def learn(self, model: str, seconds: float) -> None:
        if seconds <= 0:
            return
        known = self.seconds.get(model)
        average = seconds if known is None else DECAY * known[0] + (1 - DECAY) * seconds
        self.seconds[model] = (average, (known[1] if known else 0) + 1)
        self._changed.add(model)

    def learn_speed(self, model: str, *, tokens: int, seconds: float, first_s: float) -> None:
        """One answer of `tokens` decoded in `seconds`, its slot held `first_s` besides."""
        if tokens < SPEED_MIN_TOKENS or seconds <= 0:
            return
        speed = tokens / seconds
        known = self.speeds.get(model)
        if known is None:
            self.speeds[model] = (speed, first_s, 1)
        else:
            self.speeds[model] = (
                DECAY * known[0] + (1 - DECAY) * speed,
                DECAY * known[1] + (1 - DECAY) * first_s,
                known[2] + 1,
            )
        self._speeds_changed.add(model)

    def learn_answer(self, model: str, answer: Answer, *, held_s: float = 0.0) -> None:
        """An answer that ran (stopped or failed ones too: they held a slot that long, and
        decoded at the worker's speed while they ran). `held_s`: from its hand-out to its
        settling, as the dispatcher saw them; the next request waits for all of it, the
        worker's pick-up and the answer record's way back included, not only for the engine's
        own time (a second and more on busy cores)."""
        usage = answer.usage
        duration = usage.duration_ms
        if answer.attempt and duration:
            self.learn(model, float(duration) / 1000)
            first = float(usage.ttft_ms or 0) / 1000
            decoding = float(duration) / 1000 - first
            self.learn_speed(
                model,
                tokens=int(usage.completion_tokens or 0),
                seconds=decoding,
                first_s=max(first, held_s - decoding),
            )

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

    def speed_of(self, model: str) -> tuple[float, float] | None:
        """(tokens per second of one answer, seconds of its slot's time besides) of `model`;
        before it has them, those of the models that do (weighted by answers); None before
        any."""
        known = self.speeds.get(model)
        if known is not None:
            return known[0], known[1]
        total = sum(n for _, _, n in self.speeds.values())
        if not total:
            return None
        return (
            sum(s * n for s, _, n in self.speeds.values()) / total,
            sum(f * n for _, f, n in self.speeds.values()) / total,
        )

    def eta(self, model: str, *, place: int, slots: int) -> float:
        """The old rule, used until a speed is known: seconds until the request at `place` in
        `model`'s line starts, as its place over the slots times the service time."""
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
        if self._speeds_changed:
            pipe.hset(
                self.keys.estimates("speed"),
                mapping={
                    m: "{:.4f},{:.4f},{}".format(*self.speeds[m]) for m in self._speeds_changed
                },
            )
            pipe.expire(self.keys.estimates("speed"), ADMISSION_STATE_TTL_SECONDS)
            self._speeds_changed.clear()

    def load(self, client: redis.Redis) -> None:
        self.seconds.clear()
        self.speeds.clear()
        self._changed.clear()
        self._speeds_changed.clear()
        pipe = client.pipeline(transaction=False)
        pipe.hgetall(self.keys.estimates("service"))
        pipe.hgetall(self.keys.estimates("speed"))
        service, speeds = pipe.execute()
        for model, value in service.items():
            seconds, _, count = value.partition(",")
            try:
                self.seconds[model] = (float(seconds), int(count))
            except ValueError:
                continue  # relearned from the next answers
        for model, value in speeds.items():
            try:
                speed, first, count = value.split(",")
                self.speeds[model] = (float(speed), float(first), int(count))
            except ValueError:
                continue
