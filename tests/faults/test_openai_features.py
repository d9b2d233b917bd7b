"""The OpenAI API's features beyond plain chat across a worker kill: a streamed tool call, two
choices (n=2), log probabilities in a stream and a streamed Responses request, all running on a
worker that is killed mid-answer and run again on the one that replaces it. Each accepted
request ends once (one terminal state, one final event, one usage row) and each client gets
one whole answer: the call once, both choices, every token's log probability once, one
`response.completed`.

The workers run the `openai` engine against an upstream in this process (a stand-in for a
model server on another machine: the one thing here outside the service), which answers each
kind of request slowly and the same way every time, as a re-run must read.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from apps.usage.models import RequestUsage
from contract.protocol import TERMINAL_STATES, Keys
from tests.faults.conftest import final_events, wait_until
from tests.faults.test_workers import _running_on

MODEL = "upstream-model"
TOKENS, TOKEN_SECONDS = 40, 0.08  # about 3 s an answer: the kill lands in the middle
WORDS = [f" w{i}" for i in range(TOKENS)]
ARGUMENTS = ['{"city": "', *(f"p{i}" for i in range(TOKENS - 2)), '"}']
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ASKED = [{"role": "user", "content": "What is the weather in Paris?"}]


class Upstream(BaseHTTPRequestHandler):
    """A model server's streamed answers: a tool call in pieces when offered tools, else text,
    with each token's log probability when asked."""

    def do_GET(self):  # /v1/models: the engine's health check
        self._send(b'{"object": "list", "data": []}', "application/json")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for chunk in self._chunks(body):
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                time.sleep(TOKEN_SECONDS)
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the worker was killed: its connection went with it

    def _chunks(self, body: dict):
        if body.get("tools"):
            call = {"index": 0, "id": "call_up", "type": "function"}
            yield choice({"tool_calls": [{**call, "function": {"name": "get_weather"}}]})
            for piece in ARGUMENTS:
                yield choice({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            yield choice({}, finish="tool_calls")
        else:
            for word in WORDS:
                scored = None
                if body.get("logprobs"):
                    entry = {"token": word, "logprob": -0.5, "bytes": list(word.encode())}
                    scored = [{**entry, "top_logprobs": [entry]}]
                yield choice({"content": word}, scores=scored)
            yield choice({}, finish="stop")
        yield {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": TOKENS}}

    def _send(self, data: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def choice(delta: dict, *, finish: str | None = None, scores: list | None = None) -> dict:
    logprobs = {"content": scores} if scores else None
    return {
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]
    }


@pytest.fixture
def upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def start_worker(stack, name: str, base_url: str) -> None:
    stack._start(
        name,
        [
            sys.executable,
            "-m",
            "worker",
            "--engine",
            "openai",
            "--base-url",
            base_url,
            "--model",
            MODEL,
            "--slots",
            "8",
            "--worker-id",
            name,
            "--heartbeat-interval",
            "0.5",
            "--claim-idle-ms",
            "1000",
            "--grace",
            "3",
        ],
    )


def sse(response: httpx.Response) -> list[tuple[str, str]]:
    """(event name or "", data) of each SSE event."""
    events, name = [], ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            events.append((name, line[6:]))
            name = ""
    return events


def chunks_of(events: list[tuple[str, str]]) -> list[dict]:
    datas = [data for _, data in events]
    assert datas.count("[DONE]") == 1 and datas[-1] == "[DONE]", datas[-3:]
    return [json.loads(data) for data in datas[:-1]]


def test_tools_choices_logprobs_and_responses_each_end_once_across_a_worker_kill(
    stack, roomy_plan, make_api, upstream
):
    base = stack.web()
    stack.dispatcher()
    start_worker(stack, "w1", upstream)
    stack.wait_for_workers("w1")
    api = make_api("alice", base)
    http = api.http

    def streamed(path: str, body: dict) -> list[tuple[str, str]]:
        with http.stream("POST", base + path, json=body, timeout=90) as response:
            assert response.status_code == 200, response.read()
            return sse(response)

    def tools() -> list:
        return streamed(
            "/v1/chat/completions",
            {"model": MODEL, "messages": ASKED, "tools": [WEATHER], "stream": True},
        )

    def two_choices() -> dict:
        body = {"model": MODEL, "messages": ASKED, "n": 2, "max_tokens": 100}
        response = http.post(base + "/v1/chat/completions", json=body, timeout=90)
        assert response.status_code == 200, response.text
        return response.json()

    def scored() -> list:
        body = {"model": MODEL, "messages": ASKED, "logprobs": True, "top_logprobs": 1}
        return streamed("/v1/chat/completions", {**body, "stream": True})

    def responses() -> list:
        return streamed("/v1/responses", {"model": MODEL, "input": "Hi", "stream": True})

    keys = Keys(prefix=stack.env["SLUICE_REDIS_PREFIX"])
    client = stack.redis_server.client()

    def request_ids() -> list[str]:
        prefix = keys.request("")[: -len("{}")]
        return [key[len(prefix) + 1 : -1] for key in client.scan_iter(match=prefix + "{*}")]

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(call) for call in (tools, two_choices, scored, responses)]
        # Every answer is under way on w1 (n=2 is two requests) when it is killed.
        wait_until(
            lambda: len(_running_on(stack, "w1", request_ids())) == 5,
            timeout=30,
            what="five answers streaming on w1",
        )
        stack.signal("w1", signal.SIGKILL)
        start_worker(stack, "w2", upstream)  # the replacement re-runs them
        tool_events, choices, scored_events, response_events = [f.result() for f in futures]

    # Each client got one whole answer.
    calls = [
        call
        for chunk in chunks_of(tool_events)
        for c in chunk["choices"]
        for call in c["delta"].get("tool_calls") or []
    ]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"] == "call_up"
    assert "".join(c["function"].get("arguments", "") for c in calls) == "".join(ARGUMENTS)
    assert [c["choices"][0]["finish_reason"] for c in chunks_of(tool_events)][-1] == "tool_calls"

    assert sorted(c["index"] for c in choices["choices"]) == [0, 1]
    assert all(c["message"]["content"] == "".join(WORDS) for c in choices["choices"])
    assert choices["usage"]["completion_tokens"] == 2 * TOKENS

    text_chunks = [c for c in chunks_of(scored_events) if c["choices"]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in text_chunks)
    tokens = [
        entry["token"]
        for c in text_chunks
        for entry in (c["choices"][0]["logprobs"] or {}).get("content", [])
    ]
    assert text == "".join(WORDS) and tokens == WORDS  # nothing lost, nothing sent twice

    names = [name for name, _ in response_events]
    assert names.count("response.completed") == 1 and names[-1] == "response.completed"
    assert "response.failed" not in names and "error" not in names
    completed = json.loads(response_events[-1][1])["response"]
    assert completed["output"][0]["content"][0]["text"] == "".join(WORDS)

    # Each accepted request ended once, on the replacement, and its usage was recorded once.
    ids = request_ids()
    assert len(ids) == 5
    for request_id in ids:
        assert client.hget(keys.request(request_id), "state") in TERMINAL_STATES
        finals = final_events(client, keys, request_id)
        assert len(finals) == 1 and finals[0]["state"] == "done", (request_id, finals)
    wait_until(
        lambda: RequestUsage.objects.filter(request_id__in=ids).count() == 5,
        timeout=30,
        what="the recorder to file every answer's usage",
    )
    attempts = [int(client.hget(keys.request(i), "attempt")) for i in ids]
    assert min(attempts) >= 2  # each one ran again after the kill
