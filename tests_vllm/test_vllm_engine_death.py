"""When vLLM's engine process dies, the answer in progress fails visibly and the worker exits (to
be restarted by its supervisor) instead of taking more work it could only fail."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests_vllm.conftest import start_vllm_worker, stop_vllm_worker

pytestmark = pytest.mark.slow


@pytest.fixture
def doomed_worker():
    worker = start_vllm_worker("vllm-doomed")
    try:
        yield worker
    finally:
        stop_vllm_worker(worker)


def engine_core_pids(worker_pid: int) -> list[int]:
    """The worker's descendants whose title names vLLM's engine core (Linux /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    family, found = {worker_pid}, True
    while found:
        found = False
        for pid, parent in parents.items():
            if parent in family and pid not in family:
                family.add(pid)
                found = True
    cores = []
    for pid in family - {worker_pid}:
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "EngineCore" in title:
            cores.append(pid)
    return cores


def test_a_dead_engine_fails_the_answer_and_stops_the_worker(doomed_worker):
    assert doomed_worker.heartbeat()["healthy"] is True
    request_id = doomed_worker.submit(
        [{"role": "user", "content": "Write a very long story about a dragon."}],
        max_tokens=1000,
        temperature=0.7,
    )
    events = doomed_worker.events(request_id, until="delta")
    (core,) = engine_core_pids(doomed_worker.process.pid)
    os.kill(core, signal.SIGKILL)

    final = doomed_worker.events(request_id, after=events[-1]["id"], timeout=30)[-1]
    assert final["state"] == "failed", final
    assert final["error"]
    assert doomed_worker.process.wait(timeout=60) is not None
    # It left no heartbeat behind: the dispatcher sends it nothing more.
    assert not doomed_worker.client().exists(doomed_worker.keys.heartbeat("vllm-doomed"))
