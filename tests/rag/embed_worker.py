"""`python -m worker embed` started for a test: the bundled all-MiniLM-L6-v2 on the test's
Redis keys. Used by tests/rag and tests/worker."""

from __future__ import annotations

import signal
import subprocess
import sys

from django.conf import settings

from core.redis_client import get_redis, keys
from tests.conftest import BASE_DIR, process_env, stop_process, wait_until


def start_embed_worker(prefix: str, worker_id: str = "e1", *extra: str) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "worker",
        "embed",
        "--redis-url",
        settings.REDIS_URL,
        "--prefix",
        prefix,
        "--worker-id",
        worker_id,
        "--heartbeat-interval",
        "0.3",
        *extra,
    ]
    process = subprocess.Popen(argv, cwd=BASE_DIR, env=process_env(prefix))
    try:
        wait_until(
            lambda: process.poll() is not None or get_redis().exists(keys().embedder(worker_id)),
            timeout=180,
            what="the embedding worker to beat",
        )
    except AssertionError:
        stop_process(process)
        raise
    assert process.poll() is None, f"the embedding worker exited with {process.returncode}"
    return process


def stop_embed_worker(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGCONT)  # a paused process cannot stop
    stop_process(process)
