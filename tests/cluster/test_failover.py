"""A master of the cluster killed under load: its replica is promoted, and every accepted
request still ends exactly once, visibly, with its answer stored once (the fault suite's
invariant). Runs last in `make test-cluster`: the cluster keeps one master without a replica."""

from __future__ import annotations

import os
import signal
import time

from django.conf import settings

from contract import cluster
from contract.protocol import Keys
from tests.conftest import wait_until
from tests.faults.conftest import assert_every_request_ended


def _kill_master_of(key: str) -> str:
    """SIGKILL to the master that owns `key`'s slot (found by its own INFO); its address."""
    client = cluster.sync_client(
        settings.REDIS_URL, decode_responses=True, max_connections=2, timeout=5, connect_timeout=2
    )
    node = client.get_node_from_key(key)
    pid = int(client.info("server", target_nodes=node)["process_id"])
    client.close()
    os.kill(pid, signal.SIGKILL)
    return node.name


def _promoted(old_master: str, key: str) -> bool:
    client = cluster.sync_client(
        settings.REDIS_URL, decode_responses=True, max_connections=2, timeout=2, connect_timeout=1
    )
    try:
        client.nodes_manager.initialize()
        return client.get_node_from_key(key).name != old_master and client.ping()
    except Exception:
        return False
    finally:
        client.close()


def test_a_master_killed_under_load_loses_and_strands_nothing(cluster_stack, roomy_plan, make_api):
    stack = cluster_stack
    base = stack.up({"w1": 6, "w2": 6}, dispatchers=("dispatcher", "standby"))
    api = make_api("alice", base)
    ids = [api.submit() for _ in range(12)]
    assert all(ids)
    keys = Keys(prefix=stack.env["SLUICE_REDIS_PREFIX"])
    # The master of the dispatcher's slot: admission, the queue and every work stream.
    killed = _kill_master_of(keys.admit)
    more = []
    for _ in range(6):  # requests keep arriving while the replica takes over
        time.sleep(0.3)
        try:
            request_id = api.submit()
        except Exception:  # the web answering 5xx or timing out mid-failover is fine
            request_id = None
        if request_id:
            more.append(request_id)
    wait_until(lambda: _promoted(killed, keys.admit), timeout=30, what="a replica promoted")
    ended = assert_every_request_ended(api, stack, ids + more, timeout=120)
    assert set(ended.values()) <= {"done", "failed"}
    assert list(ended.values()).count("done") >= len(ids) // 2  # most ran to their end
    for name in ("web", "dispatcher", "w1", "w2"):
        assert stack.processes[name].poll() is None, stack.log(name)
    after = [api.submit() for _ in range(4)]  # and the service takes new work at once
    assert set(assert_every_request_ended(api, stack, after).values()) == {"done"}
