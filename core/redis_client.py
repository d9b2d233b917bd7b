"""One Redis client per process (a bounded connection pool), and the names of every key."""

from __future__ import annotations

import os
import threading

import redis
from django.conf import settings

from contract import cluster
from contract.protocol import Keys

# Connections per cluster node for a process's commands: its threads and, in a web process, the
# output hub's reads share them; past them a command waits for a free one (contract/cluster.py's
# NodePool). With the hub's one listener per node, a web process holds three per node.
CLUSTER_CONNECTIONS_PER_NODE = 2


def is_cluster() -> bool:
    """Whether REDIS_URL names a Redis Cluster (`redis+cluster://host:port,...`)."""
    return cluster.is_cluster_url(settings.REDIS_URL)


_client: redis.Redis | None = None
_creating = threading.Lock()


def get_redis() -> redis.Redis:
    """The process's client, built once: threads asking first at the same moment would each
    build one, with connections of its own."""
    global _client
    if _client is None:
        with _creating:
            if _client is None:
                _client = _new_client()
    return _client


def cluster_client(url: str, *, client_name: str):
    """A cluster client for `url`, CLUSTER_CONNECTIONS_PER_NODE per node (callers wait for a
    free one). Transactions are split by slot, pipelines by node (contract/cluster.py)."""
    return cluster.sync_client(
        url,
        decode_responses=True,
        max_connections=CLUSTER_CONNECTIONS_PER_NODE,
        timeout=settings.REDIS_SOCKET_TIMEOUT,
        connect_timeout=settings.REDIS_CONNECT_TIMEOUT,
        client_name=client_name,
    )


def _new_client() -> redis.Redis:
    if is_cluster():
        return cluster_client(settings.REDIS_URL, client_name=f"sluice-{os.getpid()}")
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
