"""A web process killed under live SSE streams: every reader resumes on another web process
from the last event it saw, with no gap and no repeat. A web process told to stop finishes the
streams it serves first."""

from __future__ import annotations

import json
import signal
import threading

import httpx

from tests.faults.conftest import assert_every_request_ended, sse_events, wait_until


def test_readers_of_a_killed_web_process_resume_elsewhere_without_gap_or_repeat(
    stack, roomy_plan, make_api
):
    first = stack.web("web-a")
    second = stack.web("web-b")
    stack.dispatcher()
    stack.worker("w1", slots=20, extra=("--sim-tokens", "80"))
    stack.wait_for_workers("w1")
    api = make_api("alice", first)
    ids = [api.submit() for _ in range(20)]
    seen: dict[str, list[dict]] = {i: [] for i in ids}  # filled as the events arrive
    resumed: set[str] = set()

    def read(request_id: str) -> None:
        events = sse_events(first, api.key, request_id, into=seen[request_id])  # cut off
        if not events or events[-1]["event"] != "final":  # when web-a dies
            resumed.add(request_id)
            after = events[-1]["id"] if events else "0"
            sse_events(second, api.key, request_id, last_event_id=after, into=events)

    readers = [threading.Thread(target=read, args=(i,)) for i in ids]
    for thread in readers:
        thread.start()
    wait_until(
        lambda: all(any(e["event"] == "delta" for e in events) for events in seen.values()),
        timeout=30,
        what="every reader to be mid-answer",
    )
    stack.signal("web-a", signal.SIGKILL)
    for thread in readers:
        thread.join(timeout=60)
    stack.web_urls.pop("web-a")
    assert set(assert_every_request_ended(api, stack, ids).values()) == {"done"}
    assert resumed  # readers were mid-answer when the process died
    for request_id in ids:
        events = seen[request_id]
        event_ids = [e["id"] for e in events]
        assert len(event_ids) == len(set(event_ids)), "an event was shown twice"
        assert events[-1]["event"] == "final"
        streamed = "".join(e["data"]["text"] for e in events if e["event"] == "delta")
        assert streamed == events[-1]["data"]["text"], "text was lost or repeated"


def test_a_web_process_told_to_stop_finishes_its_streams_and_refuses_new_work(
    stack, roomy_plan, make_api
):
    base = stack.web("web-a")
    stack.dispatcher()
    stack.worker("w1", slots=4, extra=("--sim-tokens", "80"))
    stack.wait_for_workers("w1")
    api = make_api("alice", base)
    model = api.http.get(base + "/v1/models").json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    chunks: list[dict] = []
    started = threading.Event()

    def stream() -> None:
        with api.http.stream("POST", base + "/v1/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
                    started.set()
                elif line == "data: [DONE]":
                    chunks.append({"done": True})

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(30)
    stack.signal("web-a", signal.SIGTERM)

    def refusing() -> httpx.Response | None:
        response = httpx.get(base + "/health/", timeout=5)
        return response if response.status_code == 503 else None

    refused = wait_until(refusing, timeout=10, what="the stopping web process to refuse work")
    assert refused.headers["retry-after"]
    reader.join(timeout=60)
    # The answer streamed to its end through the stop: every token, its finish reason, [DONE].
    assert chunks[-1] == {"done": True}
    reasons = [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c.get("choices")]
    assert reasons[-1] == "stop"
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1] if c.get("choices")
    )
    assert len(text.split()) >= 40
    assert stack.processes["web-a"].wait(timeout=30) == 0
