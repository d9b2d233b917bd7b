"""A process that takes from one user's buckets as fast as it can (run by test_buckets)."""

from __future__ import annotations

import sys
import time

import redis

from apps.admission.buckets import BucketStore, plan_buckets
from contract import cluster


class Limits:
    burst_requests = 20
    requests_per_minute = 600  # 10 per second
    burst_tokens = 1_000_000
    tokens_per_minute = 1_000_000
    tokens_per_day = 10_000_000


def main(url: str, key: str, seconds: float) -> None:
    if cluster.is_cluster_url(url):
        client = cluster.sync_client(
            url, decode_responses=True, max_connections=2, timeout=5, connect_timeout=2
        )
    else:
        client = redis.Redis.from_url(url, decode_responses=True)
    store = BucketStore(client)
    buckets = plan_buckets(Limits, tokens=1)
    taken = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        taken += sum(d.taken for d in store.take([(key, buckets)]))
    print(taken, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
