"""The baselines of bench/fleet.py: load balancers in front of the workers that forward each
request at once, with their own exact counts of open requests per worker.

- `least-conn`: the fewest open requests (ties drawn at random).
- `weighted-rr`: nginx's smooth weighted round robin, weights = each worker's speed x slots.
- `sticky`: consistent hashing on a ring of 160 points per unit of weight, keyed by
  conversation (by API key for API requests): session affinity.
- `cache-aware`: what SGLang's router and llm-d's prefix scorer do: the balancer keeps, per
  worker, an approximate prefix tree of the prompts it sent there (here: the running hash of
  the prompt's leading messages, as the engine caches them, least recently used dropped past
  the worker's cache size) and sends a request to the worker holding its longest prefix,
  unless that worker has more than `bound` open requests above the least-loaded one (or holds
  nothing of it): then to the least-loaded worker.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from collections import OrderedDict

BASELINES = ("least-conn", "weighted-rr", "sticky", "cache-aware")


class Ring:
    """Consistent hashing with points per worker in proportion to its weight."""

    def __init__(self, weights: dict[str, float], points: int = 160) -> None:
        ring = sorted(
            (_hash(f"{w}#{i}"), w)
            for w, weight in weights.items()
            for i in range(max(1, round(points * weight)))
        )
        self.hashes = [h for h, _ in ring]
        self.owners = [w for _, w in ring]

    def owner(self, key: str) -> str:
        return self.owners[bisect.bisect(self.hashes, _hash(key)) % len(self.owners)]


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def prefixes(messages: list[dict[str, str]]) -> list[tuple[int, int]]:
    """(running hash of the leading messages, the tokens up to and with this message), as the
    simulated engine's prefix cache keys them."""
    found, prefix, tokens = [], 0, 0
    for message in messages:
        content = message.get("content", "")
        prefix = hash((prefix, message.get("role"), content))
        tokens += max(1, len(content) // 4)
        found.append((prefix, tokens))
    return found


class Balancer:
    def __init__(
        self, policy: str, weights: dict[str, float], *, seed: int, cache_tokens: int, bound: int
    ) -> None:
        if policy not in BASELINES:
            raise ValueError(f"a balancer is one of {', '.join(BASELINES)}, not {policy!r}")
        self.policy = policy
        self.weights = weights
        self.ties = random.Random(seed)
        self.ring = Ring(weights)
        self.wrr = {w: 0.0 for w in weights}
        self.cache_tokens = cache_tokens
        self.bound = bound
        self.trees: dict[str, OrderedDict[int, int]] = {w: OrderedDict() for w in weights}
        self.tree_tokens = dict.fromkeys(weights, 0)
        self.by_cache = 0  # requests the cache-aware balancer sent for a prefix
        self.by_load = 0  # and those it sent to the least loaded

    def choose(self, *, key: str, messages: list[dict[str, str]], load: dict[str, int]) -> str:
        """The worker for a request; `load`: open requests (running + queued) per worker."""
        if self.policy == "least-conn":
            return self._least(load)
        if self.policy == "weighted-rr":  # nginx's smooth weighted round robin
            total = sum(self.weights.values())
            for w in self.wrr:
                self.wrr[w] += self.weights[w]
            chosen = max(self.wrr, key=self.wrr.__getitem__)
            self.wrr[chosen] -= total
            return chosen
        if self.policy == "sticky":
            return self.ring.owner(key)
        return self._cache_aware(messages, load)

    def _least(self, load: dict[str, int]) -> str:
        low = min(load.values())
        return self.ties.choice([w for w, n in load.items() if n == low])

    def _cache_aware(self, messages: list[dict[str, str]], load: dict[str, int]) -> str:
        steps = prefixes(messages)
        matched = {}
        for worker, tree in self.trees.items():
            held = 0
            for prefix, tokens in steps:
                if prefix not in tree:
                    break
                held = tokens
            matched[worker] = held
        most = max(matched.values())
        low = min(load.values())
        best = [w for w, held in matched.items() if held == most and most > 0]
        if best:
            chosen = min(best, key=lambda w: (load[w], self.ties.random()))
        if not best or load[chosen] - low > self.bound:
            chosen = self._least(load)
            self.by_load += 1
        else:
            self.by_cache += 1
        self._insert(chosen, steps)
        return chosen

    def _insert(self, worker: str, steps: list[tuple[int, int]]) -> None:
        tree, before = self.trees[worker], 0
        for prefix, tokens in steps:
            if prefix in tree:
                tree.move_to_end(prefix)
            else:
                tree[prefix] = tokens - before
                self.tree_tokens[worker] += tokens - before
            before = tokens
        while self.tree_tokens[worker] > self.cache_tokens and tree:
            self.tree_tokens[worker] -= tree.popitem(last=False)[1]
