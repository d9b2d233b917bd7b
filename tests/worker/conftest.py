"""What the worker's tests share: a real asyncio Redis client that counts its pipelines, and
workers run in this process on the simulated engine against the test's Redis keys."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time

import pytest
import redis.asyncio as aioredis
from django.conf import settings

from contract import protocol, transitions
from contract.protocol import Keys, WorkItem
from worker import redis_connection
from worker.engines.simulated import SimulatedEngine
from worker.runner import Worker


class CountingClient:
    """A real asyncio Redis client that counts the pipelines sent through it."""

    def __init__(self) -> None:
        self.client = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
        self.pipelines = 0

    def pipeline(self, **options):
        self.pipelines += 1
        return self.client.pipeline(**options)


@pytest.fixture
async def counting():
    counting = CountingClient()
    yield counting
    await counting.client.aclose()


@pytest.fixture
def keys(redis_prefix) -> Keys:
    return Keys(prefix=redis_prefix)


@pytest.fixture
async def redis_async():
    client = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
async def run_worker(keys):
    """Starts Worker(s) in this process; each is stopped (and awaited) after the test."""
    running: list[tuple[Worker, asyncio.Task, aioredis.Redis]] = []

    async def start(
        worker_id: str = "w1", *, engine: SimulatedEngine | None = None, **options
    ) -> Worker:
        # Named, so a test can find its connections in Redis's client list.
        client = redis_connection.connect(
            settings.REDIS_URL, decode_responses=True, client_name=f"{keys.prefix}-{worker_id}"
        )
        engine = engine or SimulatedEngine(
            slots=2, first_token_ms=5, decode_ms_per_token=2, tokens=5, faults=True
        )
        options = {
            "heartbeat_interval": 0.2,
            "claim_idle_ms": 200,
            "grace_seconds": 2,
            "read_block_ms": 200,
            **options,
        }
        worker = Worker(
            redis_client=client, engine=engine, keys=keys, worker_id=worker_id, **options
        )
        task = asyncio.create_task(worker.run())
        running.append((worker, task, client))
        return worker

    yield start
    for worker, task, client in running:
        worker.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=15)
        await client.aclose()


async def enqueue(
    client,
    keys: Keys,
    request_id: str,
    *,
    text: str = "Hi",
    stream: str | None = None,
    max_tokens: int = 5,
) -> WorkItem:
    """A request submitted straight onto a work stream, as the dispatcher hands it over."""
    item = WorkItem(
        id=request_id,
        user_id="7",
        conversation_id="3",
        max_tokens=max_tokens,
        messages=[{"role": "user", "content": text}],
    )
    pipe = client.pipeline(transaction=False)
    transitions.submitted(
        pipe,
        keys,
        item,
        citations=[],
        stream=stream or keys.work,
        submit_by_ms=protocol.now_ms() + 5000,
    )
    await pipe.execute()
    return item


async def events(client, keys: Keys, request_id: str) -> list[dict]:
    return [fields for _, fields in await client.xrange(keys.output(request_id))]


async def final_of(client, keys: Keys, request_id: str, *, timeout: float = 20) -> dict:
    """The request's final event, once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for fields in await events(client, keys, request_id):
            if fields["type"] == "final":
                return fields
        await asyncio.sleep(0.05)
    raise AssertionError(f"request {request_id} never ended")


async def eventually(check, *, timeout: float = 20, what: str = "condition", every: float = 0.05):
    """Polls a check (async, or a plain function of what is in memory) until it returns
    something truthy, and returns that; fails after `timeout` seconds naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


async def blocked_in_read(client, name: str) -> bool:
    """Whether the connection named `name` (a worker's, see run_worker) waits in a blocking
    XREADGROUP now, as Redis lists its clients."""
    return any(
        c.get("name") == name and c.get("cmd") == "xreadgroup" and "b" in c.get("flags", "")
        for c in await client.client_list()
    )


async def answer_records(client, keys: Keys, request_id: str) -> list[dict]:
    return [f for _, f in await client.xrange(keys.done) if f["id"] == request_id]
