"""Engines behind the one interface: the real llama.cpp model, and an OpenAI-compatible upstream
(a small local HTTP server stands in for the hosted API, which is outside this machine)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import aiohttp
import pytest
from aiohttp.base_protocol import BaseProtocol

from worker.engines import create_engine
from worker.engines.base import AbortFlags, EngineRequest
from worker.engines.openai import sse_batches
from worker.engines.simulated import SimulatedEngine
from worker.engines.vllm import openai_logprobs

QUESTION = [{"role": "user", "content": "What colour is the sky on a clear day?"}]


@pytest.fixture
async def llama():
    engine = create_engine("llamacpp", slots=1)
    await engine.start()
    yield engine
    await engine.stop()


@pytest.mark.slow
async def test_llamacpp_streams_a_real_answer_with_token_counts(llama):
    outputs = [
        o
        async for o in llama.generate(
            EngineRequest(id="a", messages=QUESTION, max_tokens=16, temperature=0.0)
        )
    ]
    text = "".join(o.text for o in outputs)
    assert text.strip()
    assert outputs[-1].completion_tokens == sum(1 for o in outputs if o.text)
    assert outputs[-1].prompt_tokens > 5
    assert (await llama.health()).ok


@pytest.mark.slow
async def test_llamacpp_reports_the_context_window_it_runs_with(llama):
    assert llama.context_tokens == 2048  # --n-ctx's default
    whole = create_engine("llamacpp", slots=1, n_ctx=0)  # 0: the model's own window
    await whole.start()
    try:
        assert whole.context_tokens == 8192  # SmolLM2's training context
    finally:
        await whole.stop()


@pytest.mark.slow
async def test_llamacpp_abort_stops_the_sequence_early(llama):
    request = EngineRequest(
        id="b",
        messages=[{"role": "user", "content": "Count to 500."}],
        max_tokens=300,
        temperature=0.0,
    )
    outputs = []
    async for output in llama.generate(request):
        outputs.append(output)
        if len(outputs) == 5:
            await llama.abort("b")
    assert outputs[-1].finish_reason == "abort"
    assert outputs[-1].completion_tokens < 50
    # The slot is back: another generation runs on the single model instance.
    again = [
        o
        async for o in llama.generate(
            EngineRequest(id="c", messages=QUESTION, max_tokens=4, temperature=0.0)
        )
    ]
    assert any(o.text for o in again)


class FakeUpstream(BaseHTTPRequestHandler):
    """Answers /v1/chat/completions the way OpenAI's streaming API does."""

    asked: dict = {}  # the body of the last request

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeUpstream.asked = body
        if self.headers.get("Authorization") != "Bearer secret":
            self.send_response(401)
            self.end_headers()
            self.wfile.write(b'{"error": "bad key"}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for word in ["Blue", " sky", "."]:
            chunk = {"choices": [{"delta": {"content": word}, "finish_reason": None}]}
            if body.get("logprobs"):
                entry = {"token": word, "logprob": -0.5, "bytes": list(word.encode())}
                top = [entry] * body["top_logprobs"]
                chunk["choices"][0]["logprobs"] = {"content": [{**entry, "top_logprobs": top}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        end = {"choices": [{"delta": {}, "finish_reason": "stop"}]}
        usage = {
            "choices": [],
            "usage": {"prompt_tokens": len(body["messages"]) * 7, "completion_tokens": 3},
        }
        self.wfile.write(f"data: {json.dumps(end)}\n\ndata: {json.dumps(usage)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"data": []}')

    def log_message(self, *args):
        pass


@pytest.fixture
def upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeUpstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


async def test_openai_engine_streams_deltas_and_usage(upstream):
    engine = create_engine("openai", base_url=upstream, model="m", api_key="secret")
    await engine.start()
    try:
        outputs = [o async for o in engine.generate(EngineRequest(id="x", messages=QUESTION))]
        assert "".join(o.text for o in outputs) == "Blue sky."
        assert (outputs[-1].prompt_tokens, outputs[-1].completion_tokens) == (7, 3)
        assert (await engine.health()).ok
    finally:
        await engine.stop()


async def test_openai_engine_passes_logprobs_and_logit_bias_on_and_relays_the_scores(upstream):
    engine = create_engine("openai", base_url=upstream, model="m", api_key="secret")
    await engine.start()
    try:
        plain = [o async for o in engine.generate(EngineRequest(id="p", messages=QUESTION))]
        assert "logprobs" not in FakeUpstream.asked and "logit_bias" not in FakeUpstream.asked
        assert all(o.logprobs is None for o in plain)
        asked = EngineRequest(id="x", messages=QUESTION, logprobs=2, logit_bias={"42": -100.0})
        outputs = [o async for o in engine.generate(asked)]
        sent = FakeUpstream.asked
        assert (sent["logprobs"], sent["top_logprobs"], sent["logit_bias"]) == (
            True,
            2,
            {"42": -100.0},
        )
        # Each output's entries are its own text's, as the upstream streamed them.
        for output in outputs:
            assert "".join(e["token"] for e in output.logprobs or []) == output.text
        entries = [e for o in outputs for e in o.logprobs or []]
        assert [len(e["top_logprobs"]) for e in entries] == [2, 2, 2]
    finally:
        await engine.stop()


async def test_openai_engine_reports_upstream_errors(upstream):
    engine = create_engine("openai", base_url=upstream, model="m", api_key="wrong")
    await engine.start()
    try:
        with pytest.raises(RuntimeError, match="401"):
            async for _ in engine.generate(EngineRequest(id="y", messages=QUESTION)):
                pass
    finally:
        await engine.stop()


def test_unknown_engines_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown engine 'gpt9'"):
        create_engine("gpt9")


class _Pieces:
    """An SSE body handed over in arbitrary pieces, as aiohttp's `iter_any` does."""

    def __init__(self, body: bytes, cuts: list[int]) -> None:
        self.pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]

    def on_eof(self, callback) -> None:
        pass

    def is_eof(self) -> bool:
        return False

    async def iter_any(self):
        for piece in self.pieces:
            yield piece


async def test_sse_payloads_are_read_whole_however_the_body_is_cut():
    body = b'data: {"a": 1}\n\n: keep-alive\n\ndata: {"b": "x\\ny"}\n\ndata: [DONE]'
    for cuts in ([], [1], [5, 6, 7], list(range(1, len(body)))):
        read = [data async for batch in sse_batches(_Pieces(body, cuts)) for data in batch]
        assert read == ['{"a": 1}', '{"b": "x\\ny"}', "[DONE]"], cuts


async def test_a_paused_read_takes_what_arrived_meanwhile_and_the_end_cuts_it_short():
    """The first payload is handed over at once; the read after it waits, and takes the
    chunks that came meanwhile in one batch; the body's end does not wait out the pause.
    The body is aiohttp's own StreamReader, fed as its HTTP parser feeds it."""
    loop = asyncio.get_running_loop()
    body = aiohttp.StreamReader(BaseProtocol(loop), 2**16, loop=loop)
    batches = sse_batches(body, pause=lambda: 30.0)
    body.feed_data(b"data: 1\n\n")
    assert await asyncio.wait_for(anext(batches), 1) == ["1"]
    reading = asyncio.ensure_future(anext(batches))
    await asyncio.sleep(0.01)  # the read is in its pause now
    body.feed_data(b"data: 2\n\n")
    body.feed_data(b"data: 3\n\ndata: [DONE]\n\n")
    await asyncio.sleep(0.05)
    assert not reading.done()  # still pausing: the two pieces wait to be read together
    body.feed_eof()
    assert await asyncio.wait_for(reading, 1) == ["2", "3", "[DONE]"]
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(batches), 1)


def test_abort_flags_hold_only_generations_under_way():
    flags = AbortFlags()
    flags.abort("ended-already")  # nothing runs under that id: nothing to stop, nothing kept
    assert "ended-already" not in flags and len(flags) == 0
    with flags.running("r1"):
        assert "r1" not in flags
        flags.abort("r1")
        assert "r1" in flags
    assert "r1" not in flags and len(flags) == 0


async def test_a_generation_closed_after_its_abort_leaves_no_flag():
    """A generation begun ahead of its claim is aborted and then closed without reading
    further (ahead.py's drop), and an abort may come after the end: neither stays flagged."""
    engine = SimulatedEngine(slots=2, first_token_ms=1, decode_ms_per_token=1, tokens=50)
    request = EngineRequest(id="dropped", messages=[{"role": "user", "content": "hi"}])
    outputs = engine.generate(request)
    await anext(outputs)
    await engine.abort("dropped")
    await outputs.aclose()
    stopped = EngineRequest(id="stopped", messages=request.messages)
    seen = []
    async for output in engine.generate(stopped):
        seen.append(output)
        if len(seen) == 3:
            await engine.abort("stopped")
    await engine.abort("stopped")  # after its end
    assert seen[-1].finish_reason == "abort" and len(seen) == 4
    assert len(engine._aborted) == 0


async def test_simulated_answers_share_their_decode_steps():
    """Answers decoding together wake on one tick per step, not one timer per token each; and
    each still gets all its tokens, the right number of steps apart."""
    engine = SimulatedEngine(slots=8, first_token_ms=1, decode_ms_per_token=5, tokens=20)
    ticks = []
    tick = engine.steps._tick
    engine.steps._tick = lambda due: (ticks.append(due), tick(due))

    async def answer(n: int) -> list:
        request = EngineRequest(id=f"r{n}", messages=[{"role": "user", "content": "hi"}])
        return [output async for output in engine.generate(request)]

    answers = await asyncio.gather(*(answer(n) for n in range(8)))
    assert [len(outputs) for outputs in answers] == [20] * 8
    assert all(outputs[-1].finish_reason == "stop" for outputs in answers)
    assert 19 <= len(ticks) <= 21  # 8 x 19 waits for the next token, on about 19 ticks
    gaps = [later - earlier for earlier, later in itertools.pairwise(ticks)]
    assert min(gaps) == pytest.approx(0.005, abs=1e-6)  # the cadence, kept from tick to tick


async def test_a_cancelled_answer_leaves_the_others_on_the_step():
    engine = SimulatedEngine(slots=2, first_token_ms=1, decode_ms_per_token=5, tokens=10)
    messages = [{"role": "user", "content": "hi"}]
    decoding = {"doomed": asyncio.Event(), "kept": asyncio.Event()}

    async def read(request_id: str) -> list:
        outputs = []
        async for output in engine.generate(EngineRequest(id=request_id, messages=messages)):
            outputs.append(output)
            decoding[request_id].set()
        return outputs

    doomed = asyncio.create_task(read("doomed"))
    kept = asyncio.create_task(read("kept"))
    for started in decoding.values():  # both on the step, mid-answer
        await asyncio.wait_for(started.wait(), 5)
    doomed.cancel()
    assert len(await asyncio.wait_for(kept, 5)) == 10
    assert doomed.cancelled()


def test_the_decode_steps_start_afresh_on_a_new_event_loop():
    """An engine outlives an event loop closed mid-step (tests run one loop each): its pending
    tick went with that loop, and the next loop's answers are not left waiting for it."""
    engine = SimulatedEngine(slots=1, first_token_ms=1, decode_ms_per_token=50, tokens=5)
    request = EngineRequest(id="r", messages=[{"role": "user", "content": "hi"}])

    async def first_tokens() -> None:
        outputs = engine.generate(request)
        await anext(outputs)
        with contextlib.suppress(TimeoutError):  # waiting on the step when the loop ends
            await asyncio.wait_for(anext(outputs), 0.01)

    asyncio.run(first_tokens())

    async def whole_answer() -> list:
        return [o async for o in engine.generate(request)]

    assert len(asyncio.run(asyncio.wait_for(whole_answer(), 5))) == 5


def test_vllms_log_probabilities_read_as_openais():
    @dataclass
    class Logprob:  # vLLM's shape: the sampled token's and each alternative's, by token id
        logprob: float
        rank: int
        decoded_token: str

    steps = [
        {7: Logprob(-0.1, 1, "Hi"), 9: Logprob(-2.5, 2, "Hey"), 4: Logprob(-3.0, 3, "Yo")},
        # The sampled token outside the likeliest: listed, but not as an alternative.
        {5: Logprob(-4.0, 8, " there"), 2: Logprob(-0.2, 1, "!"), 3: Logprob(-1.9, 2, ".")},
    ]
    entries = openai_logprobs([7, 5], steps, 2)
    assert [(e["token"], e["logprob"]) for e in entries] == [("Hi", -0.1), (" there", -4.0)]
    assert entries[1]["bytes"] == list(b" there")
    assert [[a["token"] for a in e["top_logprobs"]] for e in entries] == [["Hi", "Hey"], ["!", "."]]
