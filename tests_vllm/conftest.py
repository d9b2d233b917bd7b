"""A real `python -m worker --engine vllm` process, run by vLLM's CPU build in .venv-vllm.

`make test-vllm` runs these tests with the main venv's pytest (Django, Channels, the dispatcher)
and names the interpreter of the vLLM venv in SLUICE_VLLM_PYTHON; the worker is started with it.
One worker serves the whole session; a test that breaks its worker starts its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from contract.protocol import Keys, WorkItem
from tests.chat.conftest import close_thread_connections  # noqa: F401  (a fixture)

# The main suite's fixtures (user, dispatcher, live_web, ...); redis_prefix is replaced below.
from tests.conftest import *  # noqa: F403
from tests.conftest import BASE_DIR, stop_process
from worker.prepare_model import default_model_dir

SLOTS = 4
MODEL_DIR = default_model_dir()  # written by `python -m worker prepare-model`
START_TIMEOUT = 600  # seconds: a cold start on a busy two-core machine


@dataclass
class VLLMWorker:
    process: subprocess.Popen
    prefix: str
    worker_id: str
    redis_url: str

    @property
    def keys(self) -> Keys:
        return Keys(prefix=self.prefix)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, decode_responses=True)

    def heartbeat(self) -> dict:
        raw = self.client().get(self.keys.heartbeat(self.worker_id))
        assert raw, f"worker {self.worker_id} has no heartbeat (exit code {self.process.poll()})"
        return json.loads(raw)

    def heartbeat_after(self, at_ms: int, timeout: float = 10) -> dict:
        """The first heartbeat written after `at_ms` (epoch milliseconds)."""
        deadline = time.monotonic() + timeout
        while True:
            beat = self.heartbeat()
            if beat["at_ms"] > at_ms or time.monotonic() > deadline:
                return beat
            time.sleep(0.05)

    def submit(
        self, messages: list[dict[str, str]], *, max_tokens: int = 32, temperature: float = 0.0
    ) -> str:
        request_id = uuid.uuid4().hex
        item = WorkItem(
            id=request_id,
            user_id="1",
            conversation_id="1",
            messages=messages,
            max_tokens=max_tokens,
            temperature=temperature,
        )
        self.client().xadd(self.keys.work, item.to_fields())
        return request_id

    def events(
        self, request_id: str, *, until: str = "final", after: str = "0", timeout: float = 120
    ) -> list[dict]:
        """Output-stream events of a request from `after`, up to the first of type `until`."""
        client = self.client()
        events: list[dict] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "the vllm worker exited"
            response = client.xread({self.keys.output(request_id): after}, block=1000)
            for _, entries in response or []:
                for entry_id, fields in entries:
                    after = entry_id
                    events.append({"id": entry_id, **fields})
                    if fields["type"] == until:
                        return events
        raise AssertionError(f"no {until!r} event for {request_id} within {timeout}s: {events}")


def vllm_python() -> str:
    python = os.environ.get("SLUICE_VLLM_PYTHON")
    if not python:
        pytest.skip("SLUICE_VLLM_PYTHON is unset: run these through `make test-vllm`")
    if not Path(python).exists():
        pytest.fail(f"SLUICE_VLLM_PYTHON={python} does not exist: `make install-vllm`")
    if not (MODEL_DIR / "config.json").exists():
        pytest.fail(f"{MODEL_DIR} is missing: `{python} -m worker prepare-model`")
    return python


def start_vllm_worker(worker_id: str) -> VLLMWorker:
    """Starts `python -m worker --engine vllm` on a prefix of its own; returns once it beats."""
    python = vllm_python()
    redis_url = os.environ["REDIS_URL"]
    prefix = f"tv{uuid.uuid4().hex[:8]}"
    argv = [
        python,
        "-m",
        "worker",
        "--engine",
        "vllm",
        "--redis-url",
        redis_url,
        "--prefix",
        prefix,
        "--worker-id",
        worker_id,
        "--max-num-seqs",
        str(SLOTS),
        "--enforce-eager",
        "--kv-cache-gib",
        "1",
        "--heartbeat-interval",
        "0.5",
        "--grace",
        "5",
        # SmolLM2's template knows no tools: they are written in the Hermes convention, which
        # vLLM's hermes parser reads back (worker/engines/vllm_chat.py).
        "--tool-call-parser",
        "hermes",
    ]
    process = subprocess.Popen(argv, cwd=BASE_DIR, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    worker = VLLMWorker(process=process, prefix=prefix, worker_id=worker_id, redis_url=redis_url)
    client = worker.client()
    started = time.monotonic()
    while not client.exists(worker.keys.heartbeat(worker_id)):
        if process.poll() is not None:
            pytest.fail(f"the vllm worker exited with {process.returncode} while loading")
        if time.monotonic() - started > START_TIMEOUT:
            stop_process(process)
            pytest.fail(f"the vllm worker did not start within {START_TIMEOUT}s")
        time.sleep(0.2)
    print(f"[test-vllm] worker {worker_id} ready in {time.monotonic() - started:.1f}s")
    return worker


def stop_vllm_worker(worker: VLLMWorker) -> None:
    stop_process(worker.process)
    client = worker.client()
    stale = list(client.scan_iter(match=f"{worker.prefix}:*", count=1000))
    if stale:
        client.delete(*stale)


@pytest.fixture(scope="session")
def vllm_worker():
    """One worker for the session: loading vLLM takes most of a minute on two cores."""
    worker = start_vllm_worker("vllm-test")
    try:
        yield worker
    finally:
        stop_vllm_worker(worker)


@pytest.fixture
def redis_prefix(settings, vllm_worker):
    """The web side (and the dispatcher) use the vllm worker's prefix, so they share streams."""
    settings.SLUICE_REDIS_PREFIX = vllm_worker.prefix
    return vllm_worker.prefix
