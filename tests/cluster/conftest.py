"""Tests that need REDIS_URL to name a Redis Cluster: `make test-cluster` starts one (three
masters, a replica each) and runs them; elsewhere they are skipped."""

from __future__ import annotations

import pytest
from django.conf import settings

from contract import cluster
from contract.cluster import is_cluster_url
from tests.conftest import process_env
from tests.faults.conftest import Stack, make_api, roomy_plan  # noqa: F401  (fixtures)


def pytest_collection_modifyitems(config, items):
    if is_cluster_url(settings.REDIS_URL):
        return
    skip = pytest.mark.skip(reason="needs a Redis Cluster (make test-cluster)")
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(skip)


class ClusterRedis:
    """The session's cluster, as the fault suite's Stack uses its Redis."""

    def __init__(self, url: str) -> None:
        self.url = url

    def client(self):
        return cluster.sync_client(
            self.url, decode_responses=True, max_connections=4, timeout=5, connect_timeout=2
        )


@pytest.fixture
def cluster_stack(transactional_db, redis_prefix, tmp_path):
    (tmp_path / "logs").mkdir()
    env = dict(process_env(redis_prefix), LOG_LEVEL="INFO", SLUICE_DISPATCHER_LEASE_MS="1500")
    running = Stack(env=env, redis_server=ClusterRedis(settings.REDIS_URL), logs=tmp_path / "logs")
    yield running
    running.stop_all()
