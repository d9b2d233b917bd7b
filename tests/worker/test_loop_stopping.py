"""Sluice never changes what a model wrote unless the operator asked: a repetitive answer from an
upstream (a table, a list, a model asked to repeat) comes back whole, with the upstream's own
finish reason; loop stopping cuts it only where it is turned on, and then says so."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.worker.conftest import enqueue, final_of
from worker.__main__ import build_parser, stop_loops
from worker.engines import create_engine

REPEATS = 100
TOKEN_SECONDS = 0.002


class RepetitiveUpstream(BaseHTTPRequestHandler):
    """An OpenAI-compatible upstream whose every answer is "tok" a hundred times, a token every
    few milliseconds as a model streams them."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(REPEATS):
            chunk = {"choices": [{"delta": {"content": "tok "}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            time.sleep(TOKEN_SECONDS)
        end = {"choices": [{"delta": {}, "finish_reason": "stop"}]}
        usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": REPEATS}}
        self.wfile.write(f"data: {json.dumps(end)}\n\ndata: {json.dumps(usage)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def repetitive_upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), RepetitiveUpstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


async def run_one(run_worker, redis_async, keys, upstream: str, **options) -> dict:
    engine = create_engine("openai", base_url=upstream, model="m", slots=2)
    await engine.start()
    try:
        await run_worker("loops", engine=engine, **options)
        # Room for the whole answer: the cap, which Sluice keeps itself, is not under test.
        await enqueue(
            redis_async, keys, "rep", text="Say tok a hundred times.", max_tokens=4 * REPEATS
        )
        return await final_of(redis_async, keys, "rep")
    finally:
        await engine.stop()


async def test_a_repetitive_answer_comes_back_whole_by_default(
    run_worker, redis_async, keys, repetitive_upstream
):
    final = await run_one(run_worker, redis_async, keys, repetitive_upstream)
    assert final["state"] == "done"
    assert final["text"].split() == ["tok"] * REPEATS
    assert final["finish_reason"] == "stop"  # what the upstream said, not Sluice's word


async def test_loop_stopping_cuts_it_only_when_turned_on_and_says_so(
    run_worker, redis_async, keys, repetitive_upstream
):
    final = await run_one(run_worker, redis_async, keys, repetitive_upstream, stop_loops=True)
    assert final["state"] == "done"
    assert final["finish_reason"] == "loop"
    assert 0 < len(final["text"].split()) < REPEATS


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--engine", "llamacpp"], True),  # the bundled demo model, which loops
        (["--engine", "llamacpp", "--model", "/models/other.gguf"], False),
        (["--engine", "openai", "--model", "gpt"], False),
        (["--engine", "vllm"], False),
        (["--engine", "simulated"], False),
        (["--engine", "openai", "--model", "gpt", "--stop-loops", "on"], True),
        (["--engine", "llamacpp", "--stop-loops", "off"], False),
    ],
)
def test_loop_stopping_is_on_by_default_only_for_the_bundled_demo_model(
    argv, expected, monkeypatch
):
    monkeypatch.delenv("WORKER_STOP_LOOPS", raising=False)
    monkeypatch.delenv("WORKER_MODEL", raising=False)
    assert stop_loops(build_parser().parse_args(argv)) is expected
