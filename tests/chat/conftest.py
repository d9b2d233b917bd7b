"""Real processes for the request path: workers running the real model, the dispatcher that
records answers, and websocket clients speaking to the real ASGI application."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import asynccontextmanager

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from tests.conftest import BASE_DIR, process_env, stop_process


@pytest.fixture
def short_answers(settings):
    """Short answers keep the real model quick; the context window stays realistic."""
    settings.MODEL_MAX_TOKENS = 24
    settings.MODEL_TEMPERATURE = 0.0


@pytest.fixture
def start_worker(redis_prefix):
    """Starts `python -m worker` processes; all are stopped (or killed) after the test."""
    started: list[subprocess.Popen] = []

    def start(worker_id: str, *, engine: str = "llamacpp", slots: int = 1, extra=()):
        argv = [sys.executable, "-m", "worker", "--engine", engine, "--slots", str(slots),
                "--worker-id", worker_id, "--redis-url", settings.REDIS_URL,
                "--prefix", redis_prefix, "--heartbeat-interval", "0.5",
                "--claim-idle-ms", "1000", "--grace", "5", *extra]  # fmt: skip
        process = subprocess.Popen(argv, cwd=BASE_DIR, env=process_env(redis_prefix))
        started.append(process)
        return process

    yield start
    for process in started:
        stop_process(process)


@pytest.fixture
def dispatcher(transactional_db, redis_prefix):
    """`manage.py run_dispatcher` against the test database: it records finished answers."""
    process = subprocess.Popen(
        [sys.executable, "manage.py", "run_dispatcher"], cwd=BASE_DIR,
        env=process_env(redis_prefix),
    )  # fmt: skip
    yield process
    stop_process(process)


def session_cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


@asynccontextmanager
async def chat_socket(user, conversation_id: int, *, origin: bytes = b"http://testserver"):
    from chatsite.asgi import application

    headers = [(b"origin", origin), (b"host", b"testserver")]
    if user is not None:
        from asgiref.sync import sync_to_async

        headers.append((b"cookie", await sync_to_async(session_cookie)(user)))
    communicator = WebsocketCommunicator(application, f"/ws/chat/{conversation_id}/",
                                         headers=headers)  # fmt: skip
    connected, code = await communicator.connect(timeout=10)
    try:
        yield communicator, connected, code
    finally:
        await communicator.disconnect()


async def receive_until(communicator, frame_type: str, *, timeout: float = 120) -> list[dict]:
    """Frames received up to and including the first of `frame_type`."""
    frames = []
    while True:
        frame = json.loads(await communicator.receive_from(timeout=timeout))
        frames.append(frame)
        print("FRAME", frame, flush=True)
        if frame["type"] == frame_type:
            return frames
