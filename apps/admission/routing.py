"""Routing: which work stream a released request goes to.

`SLUICE_ROUTING` picks the policy:

- `affinity` (the default): a request goes to the private stream of a worker whose KV cache
  likely holds its prompt (the conversation's last worker, else the last worker that read its
  system prompt and passages; affinity.py), when that worker has room; everything else goes to
  the model's shared stream, which every worker of the model pulls from as it frees a slot.
- `pull`: the shared stream only (pull without affinity).
- `round-robin` and `least-loaded`: push each request to one worker's private stream at once,
  as a load balancer in front of GPU servers does.

Scoring (the affinity policy). Each live worker of the model that may hold part of the prompt
is scored

    score = 0.6 x cache benefit + 0.4 x (1 - load)

where the cache benefit is the share of the prompt its cache would skip (all but the newest
turn for the conversation's worker, the system message's share for the prefix's worker) and the
load is (answers running + work waiting on its stream) / slots, from its heartbeat and the
stream's length. The best one gets the request if its load is under `SLUICE_AFFINITY_MAX_LOAD`
and its score beats the shared stream's, which has no benefit and the fleet's mean load.

Why these weights: prefill of the uncached prompt is what a hit saves, and with long shared
prefixes it is as long as the whole decode, so the benefit term dominates and a conversation's
own worker (benefit near 1) wins over a worker that holds only the system prompt. The load term
breaks near-ties between such candidates. What keeps a popular worker from queueing more than
it should is the hard load threshold, not the weights: at the default `SLUICE_AFFINITY_MAX_LOAD`
of 1.0 a request goes to the worker that holds its prompt only while that worker has a free
slot. Waiting for a full worker costs the rest of an answer's decode (seconds) to save a prefill
(a fraction of a second): bench/fleet.py measured time to first token p99 several times worse
at 2.5 than pull alone, on prompts whose passages change on every question. The load counts
what the worker runs from the streams' pending entries, read on every pass, as well as its
heartbeat (release.py). Workers without a cache benefit are never pushed to; the shared stream
serves the request on whichever worker frees a slot first. Work waiting for a full worker does
not count against the other workers' room (release.py), so their free slots keep pulling from
the shared stream meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from apps.admission.affinity import AffinityStore
from apps.admission.line import QueuedRequest
from contract.protocol import Keys

AFFINITY, PULL, ROUND_ROBIN, LEAST_LOADED = "affinity", "pull", "round-robin", "least-loaded"
POLICIES = (AFFINITY, PULL, ROUND_ROBIN, LEAST_LOADED)
PUSH_POLICIES = (ROUND_ROBIN, LEAST_LOADED)
CACHE_WEIGHT, LOAD_WEIGHT = 0.6, 0.4


@dataclass
class RouteCounts:
    """How requests were routed since the dispatcher started (its metrics read them)."""

    affinity: int = 0  # to a worker holding the conversation
    prefix: int = 0  # to a worker holding the system prompt and passages only
    shared: int = 0
    pushed: int = 0  # push policies
    fallbacks: int = 0  # a cached worker existed but was too busy: the shared stream took it


@dataclass
class Router:
    keys: Keys
    store: AffinityStore
    policy: str = AFFINITY
    max_load: float = 1.0
    counts: RouteCounts = field(default_factory=RouteCounts)
    _turn: dict[str, int] = field(default_factory=dict)  # round-robin position per model

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(
                f"SLUICE_ROUTING must be one of {', '.join(POLICIES)}, not {self.policy!r}"
            )

    @property
    def pushes(self) -> bool:
        """Push policies send every request out at once; the queue is at the workers."""
        return self.policy in PUSH_POLICIES

    def route(
        self,
        requests: list[tuple[QueuedRequest, str]],
        workers: dict[str, dict],
        waiting: dict[str, int],
    ) -> list[str]:
        """The stream for each (request, model it runs on). `workers`: the live ones' heartbeats
        by id; `waiting`: work waiting (not yet read) on each one's private stream, updated as
        this pass routes."""
        if self.policy == PULL or not workers:
            self.counts.shared += len(requests)
            return [self.keys.work_for_model(model) for _, model in requests]
        if self.policy == AFFINITY:
            return self._by_affinity(requests, workers, waiting)
        streams = []
        for _, model in requests:
            ids = sorted(w for w, beat in workers.items() if _model(beat) == model)
            if not ids:
                streams.append(self.keys.work_for_model(model))
                continue
            if self.policy == ROUND_ROBIN:
                turn = self._turn.get(model, 0)
                self._turn[model] = turn + 1
                chosen = ids[turn % len(ids)]
            else:
                chosen = min(ids, key=lambda w: load_of(workers[w], waiting.get(w, 0)))
            waiting[chosen] = waiting.get(chosen, 0) + 1
            self.counts.pushed += 1
            streams.append(self.keys.work_for(chosen))
        return streams

    def _by_affinity(self, requests, workers, waiting) -> list[str]:
        shapes = [self.store.shape(request) for request, _ in requests]
        cached = self.store.lookup(
            [(r.conversation_id, s.fingerprint) for (r, _), s in zip(requests, shapes, strict=True)]
        )
        streams = []
        for (request, model), shape, (conv_worker, prefix_worker) in zip(
            requests, shapes, cached, strict=True
        ):
            self.store.routed(request.id, shape.fingerprint)
            stream = self.keys.work_for_model(model)
            candidates = [
                (w, benefit)
                for w, benefit in (
                    (conv_worker, shape.history_share),
                    (prefix_worker, shape.prefix_share),
                )
                if w in workers and _model(workers[w]) == model
            ]
            mine = [w for w, beat in workers.items() if _model(beat) == model]
            mean = sum(load_of(workers[w], waiting.get(w, 0)) for w in mine) / max(len(mine), 1)
            best, best_score = None, LOAD_WEIGHT * (1 - min(mean, 1.0))  # the shared stream's
            for worker_id, benefit in candidates:
                load = load_of(workers[worker_id], waiting.get(worker_id, 0))
                score = CACHE_WEIGHT * benefit + LOAD_WEIGHT * (1 - min(load, 1.0))
                if load < self.max_load and score >= best_score:  # a tie: it holds something
                    best, best_score = worker_id, score
            if best is not None:
                waiting[best] = waiting.get(best, 0) + 1
                stream = self.keys.work_for(best)
                if best == conv_worker:
                    self.counts.affinity += 1
                else:
                    self.counts.prefix += 1
            else:
                self.counts.shared += 1
                self.counts.fallbacks += bool(candidates)
            streams.append(stream)
        return streams


def load_of(beat: dict, waiting: int) -> float:
    """Answers running plus work waiting for it, per slot (1.0: every slot busy)."""
    slots = int(beat.get("slots") or 0)
    return (int(beat.get("busy") or 0) + waiting) / slots if slots else float("inf")


def _model(beat: dict) -> str:
    return str(beat.get("model") or "")
