"""A pure-Python reference of buckets.lua: same integer arithmetic, time passed in, and the
key's expiry (in the model's time): a key whose lifetime has run out starts again full."""

from __future__ import annotations


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class BucketModel:
    def __init__(self) -> None:
        # key → bucket name → (level, last update ms, capacity, refill per ms), all scaled
        self.state: dict[str, dict[str, tuple[int, int, int, int]]] = {}
        self.expires_at: dict[str, int] = {}

    def _expire(self, key: str, now: int) -> None:
        if key in self.expires_at and now >= self.expires_at[key]:
            del self.expires_at[key]
            self.state.pop(key, None)

    def _refilled(self, key, name, cap, rate, now):
        level, t, _, _ = self.state.get(key, {}).get(name, (cap, now, cap, rate))
        if now > t:
            level, t = min(cap, level + (now - t) * rate), now
        return level, t

    def run(self, mode: str, requests, now: int) -> list[tuple[int, int, int]]:
        """requests: [(key, [(name, cap, rate, amount), ...])], all scaled like the script."""
        out = []
        for key, buckets in requests:
            self._expire(key, now)
            current = [self._refilled(key, n, c, r, now) for n, c, r, _ in buckets]
            code, wait, which = 0, 0, 0
            if mode == "take":
                for b, ((_, cap, rate, amount), (level, _)) in enumerate(
                    zip(buckets, current, strict=True), start=1
                ):
                    if amount > cap:
                        if code < 2:
                            code, wait, which = 2, 0, b
                    elif level < amount and code < 2:
                        w = _ceil_div(amount - level, rate)
                        if code == 0 or w > wait:
                            code, wait, which = 1, w, b
            if code == 0:
                # Never shorter than the lifetime the key has left.
                ttl = max(1000, self.expires_at.get(key, now) - now)
                fields = self.state.setdefault(key, {})
                for (name, cap, rate, amount), (level, t) in zip(buckets, current, strict=True):
                    new = level - amount if mode == "take" else min(cap, level + amount)
                    fields[name] = (new, t, cap, rate)
                    ttl = max(ttl, _ceil_div(cap - new, rate) + 1000)
                self.expires_at[key] = now + ttl
            out.append((code, wait, which))
        return out

    def full_at(self, key: str) -> int:
        """When the last of the key's buckets is full again: its state must live until then."""
        return max(
            (
                t + max(0, _ceil_div(cap - level, rate))
                for level, t, cap, rate in self.state.get(key, {}).values()
            ),
            default=0,
        )
