"""Image input on the engines: an OpenAI-compatible upstream is handed a message's image parts
only where its operator says its model reads images (`--image-input`), and the engine refuses
them otherwise, before anything is sent; the text-only engines refuse them naming the part;
vLLM's renderer is handed the parts as the message's content."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from contract import capabilities
from contract.capabilities import CapabilityMissing
from contract.protocol import WorkItem
from worker.__main__ import build_parser, engine_options
from worker.engines import create_engine
from worker.engines.base import EngineRequest
from worker.engines.vllm_chat import engine_messages

PIXEL = "data:image/png;base64,iVBORw0KGgo="
PARTS = [
    {"type": "text", "text": "What is this?"},
    {"type": "image_url", "image_url": {"url": PIXEL, "detail": "low"}},
]
ASKED = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is this?", "parts": PARTS},
]


class Upstream(BaseHTTPRequestHandler):
    """Answers "A dot." and keeps what it was sent."""

    bodies: list[dict] = []

    def do_POST(self):
        Upstream.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunks = [
            {"choices": [{"delta": {"content": "A dot."}}]},
            {"choices": [{"delta": {}, "finish_reason": "stop"}]},
        ]
        for chunk in chunks:
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def upstream():
    Upstream.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


async def answer(engine) -> list:
    await engine.start()
    try:
        return [o async for o in engine.generate(EngineRequest(id="i", messages=ASKED))]
    finally:
        await engine.stop()


async def test_the_openai_engine_passes_images_on_only_where_the_operator_says(upstream):
    plain = create_engine("openai", base_url=upstream, model="m")
    assert capabilities.IMAGE_INPUT not in plain.capabilities
    with pytest.raises(CapabilityMissing) as raised:
        await answer(plain)
    assert raised.value.param == "messages[1].content[1].image_url"
    assert Upstream.bodies == []  # refused before anything went upstream

    options = engine_options(
        build_parser().parse_args(
            ["--engine", "openai", "--base-url", upstream, "--model", "m", "--image-input"]
        )
    )
    seeing = create_engine("openai", **options)
    assert capabilities.IMAGE_INPUT in seeing.capabilities  # announced in the heartbeat
    outputs = await answer(seeing)
    assert "".join(o.text for o in outputs) == "A dot."
    (sent,) = Upstream.bodies
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": PARTS},  # as the client sent them
    ]


async def test_the_simulated_engine_refuses_an_image_naming_the_part():
    engine = create_engine("simulated", tokens=3)
    with pytest.raises(CapabilityMissing) as raised:
        await answer(engine)
    assert raised.value.param == "messages[1].content[1].image_url"
    assert "image input" in str(raised.value)


def test_vllms_renderer_reads_the_parts_as_the_content():
    assert engine_messages(ASKED) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": PARTS},
    ]


def test_the_parts_travel_in_the_work_item():
    item = WorkItem(id="r", user_id="1", conversation_id="", messages=ASKED)
    back = WorkItem.from_fields(item.to_fields())
    assert back.messages == ASKED
    assert capabilities.asked(back) == {
        "messages[1].content[1].image_url": capabilities.IMAGE_INPUT
    }
