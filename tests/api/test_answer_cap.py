"""The answer cap is Sluice's to keep, whatever engine runs the model: an OpenAI-compatible
upstream that ignores `max_tokens` still has its answer cut at the caller's `max_tokens` (and
at the plan's cap), and the client hears `length`."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from contract.protocol import Keys
from core.redis_client import get_redis
from tests.admission.conftest import force_level
from tests.chat.test_openai_api import client_for, roomy
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CAP = 50  # the plan's answer cap


@pytest.fixture
def plan(transactional_db):
    force_level(0)
    return roomy(max_tokens_cap=CAP)


class HeedlessUpstream(BaseHTTPRequestHandler):
    """An OpenAI-compatible upstream that answers "tok" as many times as the last message
    asks ("say tok 20 times"), whatever the request's `max_tokens`, and says it stopped by
    itself."""

    def do_GET(self):  # the worker's health probe (GET /v1/models)
        body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        count = int(re.search(r"(\d+) times", body["messages"][-1]["content"]).group(1))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for _ in range(count):
                chunk = {"choices": [{"delta": {"content": "tok "}, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            end = {"choices": [{"delta": {}, "finish_reason": "stop"}]}
            usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": count}}
            self.wfile.write(f"data: {json.dumps(end)}\n\ndata: {json.dumps(usage)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the worker left once it had what it needed

    def log_message(self, *args):
        pass


@pytest.fixture
def heedless(plan, live_web, dispatcher, start_worker, redis_prefix):
    """An `openai`-engine worker serving "alpha" from the upstream above (the plan is written
    before the dispatcher starts, which reads plans when it starts)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), HeedlessUpstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    upstream = f"http://127.0.0.1:{server.server_address[1]}/v1"
    start_worker(
        "wo",
        engine="openai",
        slots=2,
        extra=("--base-url", upstream, "--model", "m", "--served-model-name", "alpha"),
    )
    keys = Keys(prefix=redis_prefix)
    wait_until(lambda: get_redis().exists(keys.heartbeat("wo")), what="the worker to beat")
    yield live_web
    server.shutdown()


def say(count: int) -> list[dict]:
    return [{"role": "user", "content": f"Say tok {count} times."}]


def test_an_upstream_that_ignores_max_tokens_is_cut_at_the_cap(heedless, key):
    client = client_for(heedless, key)
    whole = client.chat.completions.create(model="alpha", messages=say(20))
    assert whole.choices[0].message.content == "tok " * 20  # under the cap: untouched
    assert whole.choices[0].finish_reason == "stop"

    capped = client.chat.completions.create(model="alpha", messages=say(100), max_tokens=5)
    assert capped.choices[0].message.content == "tok " * 5
    assert capped.choices[0].finish_reason == "length"
    assert capped.usage.completion_tokens == 5

    chunks = list(  # no max_tokens: the plan's cap holds
        client.chat.completions.create(
            model="alpha", messages=say(100), stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "tok " * CAP
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == CAP
