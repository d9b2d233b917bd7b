"""One Redis client per process (a bounded connection pool), and the names of every key."""

from __future__ import annotations

import functools
import os

import redis
from django.conf import settings

from worker import cluster
from worker.protocol import Keys

CLUSTER_POOL_CEILING = 32


def is_cluster() -> bool:
    """Whether REDIS_URL names a Redis Cluster (`redis+cluster://host:port,...`)."""
    return cluster.is_cluster_url(settings.REDIS_URL)


@functools.cache
def get_redis() -> redis.Redis:
    if is_cluster():
        # Transactions are split by slot (worker/cluster.py). redis-py's cluster client cannot
        # make a caller wait for a free connection: past the ceiling a command fails, and the
        # client takes the failure for a lost node. So the ceiling per node sits above the
        # process's threads (WEB_DB_THREADS); connections open only as commands overlap.
        return cluster.sync_client(
            settings.REDIS_URL, decode_responses=True,
            max_connections=max(settings.REDIS_POOL_SIZE, CLUSTER_POOL_CEILING),
            timeout=settings.REDIS_SOCKET_TIMEOUT, connect_timeout=settings.REDIS_CONNECT_TIMEOUT,
            client_name=f"sluice-{os.getpid()}",
        )  # fmt: skip
    # A small blocking pool: Redis connections per process stay fixed however many requests
    # run at once (callers wait for a free connection). Timeouts: a frozen or unreachable Redis
    # fails a command within seconds instead of hanging the request that sent it. Named, so
    # CLIENT LIST shows who is who.
    pool = redis.BlockingConnectionPool.from_url(
        settings.REDIS_URL,
        decode_responses=True,
        max_connections=settings.REDIS_POOL_SIZE,
        timeout=settings.REDIS_SOCKET_TIMEOUT,
        socket_timeout=settings.REDIS_SOCKET_TIMEOUT,
        socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT,
        client_name=f"sluice-{os.getpid()}",
    )
    return redis.Redis(connection_pool=pool)


def keys() -> Keys:
    """Redis names under this deployment's (or this test's) prefix."""
    return Keys(prefix=settings.SLUICE_REDIS_PREFIX)
