"""What a request asks of the sampler, on the engines themselves: the real llama.cpp model held to
a JSON schema or to JSON, a seed that gives the same answer twice, the penalties; and an
OpenAI-compatible upstream handed the same parameters (a small local server stands in for it)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from contract.capabilities import EngineRefused
from worker.engines import create_engine
from worker.engines.base import EngineRequest

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
ALICE = [{"role": "user", "content": "Alice is 31 years old. Reply with her name and age."}]
SKY = [
    {
        "role": "user",
        "content": 'What colour is the sky? Answer as a JSON object with the key "colour".',
    }
]
STORY = [{"role": "user", "content": "Tell me a short story about a lighthouse."}]


@pytest.fixture
async def llama():
    engine = create_engine("llamacpp", slots=2)
    await engine.start()
    yield engine
    await engine.stop()


async def answer(engine, request: EngineRequest) -> tuple[str, str | None]:
    outputs = [o async for o in engine.generate(request)]
    return "".join(o.text for o in outputs), outputs[-1].finish_reason


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": True}}


@pytest.mark.slow
async def test_llamacpp_holds_the_answer_to_the_schema(llama):
    for n, temperature in enumerate((0.0, 1.0, 1.5)):  # even a hot sampler stays in the schema
        text, reason = await answer(
            llama,
            EngineRequest(
                id=f"s{n}",
                messages=ALICE,
                max_tokens=64,
                temperature=temperature,
                response_format=schema_format(PERSON),
            ),
        )
        person = json.loads(text)
        assert reason == "stop"
        assert set(person) == {"name", "age"}
        assert isinstance(person["name"], str) and len(person["name"]) <= 24
        assert isinstance(person["age"], int) and 0 <= person["age"] <= 150


@pytest.mark.slow
async def test_llamacpp_json_mode_answers_a_json_object(llama):
    text, reason = await answer(
        llama,
        EngineRequest(
            id="j",
            messages=SKY,
            max_tokens=96,
            temperature=0.0,
            response_format={"type": "json_object"},
        ),
    )
    assert reason == "stop"
    assert isinstance(json.loads(text), dict)


@pytest.mark.slow
async def test_llamacpp_refuses_a_schema_it_cannot_enforce(llama):
    unresolvable = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    with pytest.raises(EngineRefused, match="JSON schema"):
        await answer(
            llama,
            EngineRequest(id="bad", messages=ALICE, response_format=schema_format(unresolvable)),
        )


@pytest.mark.slow
async def test_llamacpp_gives_the_same_answer_for_the_same_seed(llama):
    def story(request_id: str, seed: int | None, **penalties) -> EngineRequest:
        return EngineRequest(
            id=request_id, messages=STORY, max_tokens=32, temperature=1.0, seed=seed, **penalties
        )

    first, _ = await answer(llama, story("a", 1234))
    second, _ = await answer(llama, story("b", 1234))  # its slot's cache holds the prompt now
    assert first and first == second
    others = {(await answer(llama, story(f"o{seed}", seed)))[0] for seed in (1, 2, 3)}
    assert len(others | {first}) > 1  # the seed, not the engine, fixed the answer
    # With penalties the model is held back from its own words, and still answers.
    penalised, reason = await answer(
        llama, story("p", 1234, presence_penalty=1.5, frequency_penalty=1.5)
    )
    assert penalised.strip() and reason in ("stop", "length")


class RecordingUpstream(BaseHTTPRequestHandler):
    """Answers a streamed chat completion with one word, keeping each request's body."""

    bodies: list[dict] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        RecordingUpstream.bodies.append(body)
        if body.get("response_format", {}).get("type") == "json_schema" and body.get("seed") == 13:
            self.send_response(400)  # the upstream's own refusal, as vLLM's server words one
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "schema not supported"}}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunk = {"choices": [{"delta": {"content": "{}"}, "finish_reason": "stop"}]}
        self.wfile.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def upstream():
    RecordingUpstream.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), RecordingUpstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


async def test_the_openai_engine_hands_the_parameters_to_its_upstream(upstream):
    engine = create_engine("openai", base_url=upstream, model="m")
    await engine.start()
    try:
        await answer(engine, EngineRequest(id="plain", messages=ALICE))
        asked = EngineRequest(
            id="asked",
            messages=ALICE,
            response_format=schema_format(PERSON),
            seed=7,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
        )
        assert await answer(engine, asked) == ("{}", "stop")
        plain, sent = RecordingUpstream.bodies
        assert not {"response_format", "seed", "presence_penalty", "frequency_penalty"} & set(plain)
        assert sent["response_format"] == schema_format(PERSON)
        assert (sent["seed"], sent["presence_penalty"], sent["frequency_penalty"]) == (7, 0.5, -0.5)
        # The upstream's 400 is the request's fault, told in the upstream's words.
        refused = EngineRequest(
            id="no", messages=ALICE, response_format=schema_format(PERSON), seed=13
        )
        with pytest.raises(EngineRefused, match="schema not supported"):
            await answer(engine, refused)
    finally:
        await engine.stop()
