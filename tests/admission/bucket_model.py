"""A pure-Python reference of buckets.lua: same integer arithmetic, time passed in."""

from __future__ import annotations


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class BucketModel:
    def __init__(self) -> None:
        self.state: dict[str, dict[str, tuple[int, int]]] = {}
        self.ttl_ms: dict[str, int] = {}

    def _refilled(self, key, name, cap, rate, now):
        level, t = self.state.get(key, {}).get(name, (cap, now))
        if now > t:
            level, t = min(cap, level + (now - t) * rate), now
        return level, t

    def run(self, mode: str, requests, now: int) -> list[tuple[int, int, int]]:
        """requests: [(key, [(name, cap, rate, amount), ...])], all scaled like the script."""
        out = []
        for key, buckets in requests:
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
                ttl = 1000
                fields = self.state.setdefault(key, {})
                for (name, cap, rate, amount), (level, t) in zip(buckets, current, strict=True):
                    new = level - amount if mode == "take" else min(cap, level + amount)
                    fields[name] = (new, t)
                    ttl = max(ttl, _ceil_div(cap - new, rate) + 1000)
                self.ttl_ms[key] = ttl
            out.append((code, wait, which))
        return out
