"""The vllm engine for real: a worker process running vLLM's CPU build, driven through Redis
Streams exactly as the dispatcher drives it (work stream in, output stream and done stream out)."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from contract.protocol import Answer, State
from tests.chat.conftest import answer_text

pytestmark = pytest.mark.slow


def answer_record(worker, request_id: str, timeout: float = 10) -> Answer:
    """The request's record on the done stream (written just after the final event)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for _, fields in worker.client().xrange(worker.keys.done):
            if fields["id"] == request_id:
                return Answer.from_fields(fields)
        time.sleep(0.05)
    raise AssertionError(f"no answer record for {request_id}")


def test_chat_round_trip(vllm_worker):
    request_id = vllm_worker.submit(
        [{"role": "user", "content": "What is the capital of France?"}], max_tokens=32
    )
    events = vllm_worker.events(request_id)

    final = events[-1]
    usage = json.loads(final["usage"])
    assert final["state"] == "done", final
    assert "Paris" in final["text"]
    assert answer_text(events) == final["text"]
    assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 32
    assert events[0]["type"] == "start" and events[0]["worker"] == vllm_worker.worker_id

    # The answer record the recorder stores in PostgreSQL.
    record = answer_record(vllm_worker, request_id)
    assert (record.state, record.text) == (State.DONE, final["text"])
    assert record.usage.completion_tokens == usage["completion_tokens"]

    # vLLM's own figures reach the dispatcher through the heartbeat.
    beat = vllm_worker.heartbeat()
    assert beat["engine"] == "vllm" and beat["healthy"] is True
    assert beat["slots"] == beat["engine_metrics"]["max_num_seqs"] == 4
    assert {"kv_cache_usage", "running", "waiting", "prefix_cache_hit_rate"} <= set(
        beat["engine_metrics"]
    )


def test_concurrent_answers_share_the_engine(vllm_worker):
    # Answers that run to max_tokens, so all three are in the engine at the same time.
    questions = [
        "Count from 1 to 60, separated by commas.",
        "Count from 100 to 160, separated by commas.",
        "List the letters of the alphabet, separated by commas.",
    ]
    ids = [vllm_worker.submit([{"role": "user", "content": q}], max_tokens=40) for q in questions]
    # While they run, the engine reports them as one batch.
    seen_running = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and seen_running < 2:
        seen_running = max(seen_running, vllm_worker.heartbeat()["engine_metrics"]["running"])
        time.sleep(0.1)
    finals = [vllm_worker.events(request_id)[-1] for request_id in ids]
    assert [f["state"] for f in finals] == ["done"] * 3
    assert all(f["text"].strip() for f in finals)
    assert seen_running >= 2


def test_stop_aborts_the_sequence_in_the_engine(vllm_worker):
    request_id = vllm_worker.submit(
        [{"role": "user", "content": "Write a very long story about a dragon who bakes bread."}],
        max_tokens=1000,
        temperature=0.7,
    )
    events = vllm_worker.events(request_id, until="delta")
    running = vllm_worker.heartbeat_after(int(time.time() * 1000))["engine_metrics"]
    assert running["running"] >= 1 and running["unfinished"] >= 1

    stopped_at = time.monotonic()
    vllm_worker.client().set(vllm_worker.keys.cancel(request_id), "1", ex=60)
    events += vllm_worker.events(request_id, after=events[-1]["id"], timeout=30)
    final = events[-1]
    assert final["state"] == "cancelled", final
    assert json.loads(final["usage"])["completion_tokens"] < 1000
    assert time.monotonic() - stopped_at < 10

    # In the engine: nothing runs or waits any more, and its scheduler has stopped stepping.
    idle = vllm_worker.heartbeat_after(int(time.time() * 1000))["engine_metrics"]
    assert (idle["running"], idle["waiting"], idle["unfinished"]) == (0, 0, 0)
    time.sleep(1.5)
    later = vllm_worker.heartbeat_after(int(time.time() * 1000))["engine_metrics"]
    assert later["engine_steps"] == idle["engine_steps"]
    assert vllm_worker.heartbeat()["busy"] == 0


def test_a_shared_long_prefix_hits_the_prefix_cache_on_the_second_request(vllm_worker):
    # A prefix no earlier request has used (the token at its start makes it unique), several
    # KV blocks long (vLLM's CPU build caches whole blocks of 128 tokens).
    facts = " ".join(f"Fact {i}: {i} is {'even' if i % 2 == 0 else 'odd'}." for i in range(80))
    system = f"Reference {uuid.uuid4().hex}. {facts}"

    def ask(question: str) -> dict:
        request_id = vllm_worker.submit(
            [{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=4,
        )
        final = vllm_worker.events(request_id)[-1]
        assert final["state"] == "done", final
        return vllm_worker.heartbeat_after(int(time.time() * 1000))["engine_metrics"]

    before = vllm_worker.heartbeat()["engine_metrics"]
    first = ask("Is 7 odd?")
    second = ask("Is 8 even?")

    prompt = first["prefix_cache_queries"] - before["prefix_cache_queries"]
    assert prompt >= 512
    assert first["prefix_cache_hits"] == before["prefix_cache_hits"]  # a cold prefix: no hit
    hits = second["prefix_cache_hits"] - first["prefix_cache_hits"]
    assert hits >= 384  # at least three of the shared blocks came from the cache
    assert second["prefix_cache_hit_rate"] > first["prefix_cache_hit_rate"]
