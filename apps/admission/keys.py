"""Redis names of the admission state. All share the `{adm}` hash tag: on a Redis Cluster they
live in one slot, so the bucket script and the queue's transactions stay single-slot."""

from __future__ import annotations

from dataclasses import dataclass

DISPATCHER_GROUP = "dispatcher"  # consumer group of the dispatcher on the admission stream
# One consumer name for whichever dispatcher holds the lease: a new holder re-reads what the
# old one had been delivered but not yet acknowledged.
ACTIVE_CONSUMER = "active"
STATE_TTL_SECONDS = 7 * 24 * 3600  # queue / charge hashes: refreshed on every write
METRICS_TTL_SECONDS = 30 * 24 * 3600


@dataclass(frozen=True)
class AdmissionKeys:
    prefix: str = "sluice"

    def _k(self, name: str) -> str:
        return f"{self.prefix}:{{adm}}:{name}"

    def bucket(self, user_id: str) -> str:
        return self._k(f"bucket:{user_id}")

    @property
    def lease(self) -> str:
        return self._k("lease")

    @property
    def queue(self) -> str:
        """Hash: request id → JSON of a queued request (the authoritative queue)."""
        return self._k("queue")

    @property
    def charges(self) -> str:
        """Hash: request id → JSON of what its buckets were charged, until reconciled."""
        return self._k("charges")

    @property
    def inflight(self) -> str:
        """Hash: request id → "user|dispatched ms" for requests on workers (max_concurrent)."""
        return self._k("inflight")

    @property
    def cancels(self) -> str:
        """Set: ids of requests whose user pressed stop, emptied by the dispatcher's sweep. It
        finds a waiting request's stop at once, wherever it is in a long queue."""
        return self._k("cancels")

    @property
    def degradation(self) -> str:
        return self._k("degradation")

    @property
    def metrics(self) -> str:
        return self._k("metrics")
