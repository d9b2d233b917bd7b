"""Real processes: two dispatchers, the active one killed with requests queued, a real worker
running the real model afterwards. Every request still ends done."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from contract.protocol import Keys
from core.redis_client import get_redis
from tests.admission.conftest import final, force_level, publish
from tests.conftest import BASE_DIR, process_env, stop_process, wait_until


@pytest.mark.slow
def test_killing_the_active_dispatcher_loses_no_queued_request(
    transactional_db, admission, user, short_answers, start_worker, redis_prefix
):
    force_level(0)  # this machine's own load must not shed the requests
    env = dict(process_env(redis_prefix), SLUICE_DISPATCHER_LEASE_MS="1500")
    dispatchers = [
        subprocess.Popen([sys.executable, "manage.py", "run_dispatcher"], cwd=BASE_DIR, env=env)
        for _ in range(2)
    ]
    try:
        keys = Keys(prefix=redis_prefix)
        client = get_redis()
        holder = wait_until(lambda: client.get(keys.lease), timeout=60, what="a lease holder")
        ids = [publish(user.id, max_tokens=8) for _ in range(3)]
        # No worker yet: all three wait in the queue (in Redis).
        wait_until(lambda: client.hlen(keys.queue) == 3, timeout=30, what="three queued")
        os.kill(int(holder.rsplit("-", 1)[1]), signal.SIGKILL)
        wait_until(
            lambda: client.get(keys.lease) not in (None, holder),
            timeout=30,
            what="the standby to take the lease",
        )
        start_worker("w1")
        ends = wait_until(
            lambda: all(final(i) for i in ids) and [final(i) for i in ids],
            timeout=240,
            what="every request to end",
        )
        assert [end["state"] for end in ends] == ["done"] * 3
        assert client.hlen(keys.queue) == 0
        assert all(client.hget(keys.request(i), "state") == "done" for i in ids)
    finally:
        for process in dispatchers:
            stop_process(process)
