"""Tool calls on the engines themselves: the real llama.cpp demo model held by a grammar to a
call of the request's tool (required, named) or left to write text (none, or a tool's result in
hand); the text form of calls read back; an OpenAI-compatible upstream handed the tools and its
streamed call deltas gathered; and the work item and answer fields that carry them, additive
for a process of the previous release."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from contract import capabilities
from contract.capabilities import TOOLS, CapabilityMissing
from contract.protocol import Answer, State, WorkItem, final_fields
from worker import tool_calls
from worker.engines import create_engine
from worker.engines.base import EngineRequest
from worker.engines.simulated import SimulatedEngine

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
PARIS = [{"role": "user", "content": "What's the weather in Paris?"}]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
ANSWERED = [
    *PARIS,
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18, "sky": "sunny"}'},
]


def test_calls_written_as_text_parse_back_into_openais_shape():
    text = tool_calls.call_text("get_weather", {"city": "Paris"})
    two = f"{text}\n{tool_calls.call_text('get_time', {})}"
    calls = tool_calls.parse_calls(two)
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["id"] != calls[1]["id"]
    # A call whose arguments hold the closing tag still parses: the JSON decides where it ends.
    tricky = tool_calls.call_text("note", {"text": "</tool_call>"})
    assert json.loads(tool_calls.parse_calls(tricky)[0]["function"]["arguments"]) == {
        "text": "</tool_call>"
    }
    # Cut short, or not a call: no calls (the text goes to the client as written).
    for text in (
        two[:-5],
        "plain words",
        '<tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>',
    ):
        assert tool_calls.parse_calls(text) is None


def test_the_watch_passes_text_on_and_holds_a_call_back():
    watch = tool_calls.CallWatch()
    assert [watch.feed(t) for t in ("Hel", "lo", " there")] == ["Hel", "lo", " there"]
    assert watch.end() == (None, "")
    watch = tool_calls.CallWatch()
    call = tool_calls.call_text("get_time", {})
    assert [watch.feed(piece) for piece in (call[:3], call[3:20], call[20:])] == ["", "", ""]
    calls, held = watch.end()
    assert calls[0]["function"] == {"name": "get_time", "arguments": "{}"} and held == ""
    # Text that only began like a call is sent once it is clearly not one.
    watch = tool_calls.CallWatch()
    assert watch.feed("<to") == "" and watch.feed("day") == "<today"
    # A call cut short is the model's text, kept as written.
    watch = tool_calls.CallWatch()
    watch.feed(call[:30])
    assert watch.end() == (None, call[:30])


def test_a_conversation_with_tools_is_written_as_text_for_the_chat_template():
    request = EngineRequest(
        id="r", messages=[{"role": "system", "content": "Be brief."}, *ANSWERED], tools=[WEATHER]
    )
    system, user, called, result = tool_calls.as_text_messages(request)
    assert system["content"].startswith("Be brief.\n\nYou can call these functions:")
    assert '"name": "get_weather"' in system["content"]
    assert user == PARIS[0]
    assert called == {
        "role": "assistant",
        "content": tool_calls.call_text("get_weather", {"city": "Paris"}),
    }
    assert result["role"] == "tool" and '"sunny"' in result["content"]
    # tool_choice none: nothing about calling them; a named function is asked for by name.
    quiet = EngineRequest(id="q", messages=PARIS, tools=[WEATHER], tool_choice="none")
    assert tool_calls.as_text_messages(quiet) == PARIS
    named = EngineRequest(
        id="n", messages=PARIS, tools=[WEATHER, TIME], tool_choice=choose("get_time")
    )
    assert "Call the function get_time now." in tool_calls.as_text_messages(named)[0]["content"]


def choose(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


async def test_tools_ask_for_the_capability_and_the_simulated_engine_refuses_them():
    def item(**asked) -> WorkItem:
        return WorkItem(id="r", user_id="1", conversation_id="", **asked)

    assert capabilities.asked(item(messages=PARIS, tools=[WEATHER])) == {"tools": TOOLS}
    # A replayed call or result asks for it too, tools or not.
    assert capabilities.asked(item(messages=ANSWERED)) == {"messages[1].tool_calls": TOOLS}
    assert capabilities.asked(item(messages=ANSWERED[2:])) == {"messages[0].role": TOOLS}
    assert capabilities.asked(item(messages=PARIS, tool_choice="none")) == {}

    engine = SimulatedEngine(tokens=2, first_token_ms=0, decode_ms_per_token=0)
    with pytest.raises(CapabilityMissing) as raised:
        async for _ in engine.generate(EngineRequest(id="r", messages=PARIS, tools=[WEATHER])):
            pass
    assert raised.value.param == "tools"


def test_tools_and_calls_travel_as_optional_fields():
    sent = WorkItem(
        id="r",
        user_id="1",
        conversation_id="",
        messages=ANSWERED,
        tools=[WEATHER],
        tool_choice=choose("get_weather"),
        parallel_tool_calls=False,
    )
    back = WorkItem.from_fields(sent.to_fields())
    assert (back.messages, back.tools) == (ANSWERED, [WEATHER])
    assert back.tool_choice == choose("get_weather") and back.parallel_tool_calls is False
    plain = WorkItem(id="r", user_id="1", conversation_id="", messages=PARIS).to_fields()
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(plain)

    answer = Answer(id="r", user_id="1", conversation_id="", state=State.DONE, tool_calls=[CALL])
    answer.finish_reason = "tool_calls"
    assert Answer.from_fields(answer.to_fields()).tool_calls == [CALL]
    assert json.loads(final_fields(answer)["tool_calls"]) == [CALL]
    # An answer without calls is the record the previous release wrote and read.
    answer.tool_calls = []
    assert "tool_calls" not in answer.to_fields() and "tool_calls" not in final_fields(answer)


# -- the llama.cpp demo model ------------------------------------------------------------------


@pytest.fixture
async def llama():
    engine = create_engine("llamacpp", slots=1)
    await engine.start()
    yield engine
    await engine.stop()


async def run(engine, **asked) -> tuple[str, list]:
    request = EngineRequest(id="t", temperature=0.0, max_tokens=80, **asked)
    outputs = [o async for o in engine.generate(request)]
    assert sum(1 for o in outputs if o.tool_calls) <= 1  # calls come whole, once, at the end
    return "".join(o.text for o in outputs), outputs[-1]


@pytest.mark.slow
async def test_llamacpp_calls_the_tool_it_is_told_to_with_arguments_in_its_schema(llama):
    for choice in ("required", choose("get_weather")):
        text, last = await run(llama, messages=PARIS, tools=[WEATHER, TIME], tool_choice=choice)
        assert text == "" and last.finish_reason == "tool_calls"
        for call in last.tool_calls:
            arguments = json.loads(call["function"]["arguments"])
            if call["function"]["name"] == "get_time":
                assert choice == "required" and arguments == {}
                continue
            assert call["function"]["name"] == "get_weather"
            assert set(arguments) <= {"city", "unit"} and isinstance(arguments["city"], str)
            assert arguments.get("unit", "celsius") in ("celsius", "fahrenheit")
        if choice != "required":  # a named function: that one, once
            assert len(last.tool_calls) == 1
        # The call's tokens are counted like any other.
        assert last.completion_tokens > 10
    # Not allowed to run in parallel: one call.
    _, last = await run(
        llama, messages=PARIS, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False
    )
    assert len(last.tool_calls) == 1


@pytest.mark.slow
async def test_llamacpp_answers_in_words_with_none_or_with_the_result_in_hand(llama):
    text, last = await run(llama, messages=PARIS, tools=[WEATHER], tool_choice="none")
    assert text.strip() and last.tool_calls is None and last.finish_reason in ("stop", "length")
    text, last = await run(llama, messages=ANSWERED, tools=[WEATHER])
    assert last.tool_calls is None and last.finish_reason == "stop"
    assert "sunny" in text.lower()  # it read the tool's result


class ToolUpstream(BaseHTTPRequestHandler):
    """Answers with one tool call, streamed in pieces as OpenAI streams it."""

    bodies: list[dict] = []

    def do_POST(self):
        ToolUpstream.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        pieces = [
            {"index": 0, "id": "call_up", "type": "function", "function": {"name": "get_weather"}},
            {"index": 0, "function": {"arguments": '{"city": '}},
            {"index": 0, "function": {"arguments": '"Paris"}'}},
        ]
        chunks = [{"choices": [{"delta": {"tool_calls": [p]}}]} for p in pieces]
        chunks.append({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]})
        chunks.append({"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 9}})
        for chunk in chunks:
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


async def test_the_openai_engine_passes_tools_on_and_gathers_the_upstreams_call():
    ToolUpstream.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), ToolUpstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    engine = create_engine(
        "openai", base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", model="m"
    )
    await engine.start()
    try:
        request = EngineRequest(
            id="u",
            messages=ANSWERED,
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
        )
        outputs = [o async for o in engine.generate(request)]
    finally:
        await engine.stop()
        server.shutdown()
    (sent,) = ToolUpstream.bodies
    assert sent["tools"] == [WEATHER] and sent["tool_choice"] == "required"
    assert sent["parallel_tool_calls"] is False
    assert sent["messages"][1] == {"role": "assistant", "content": None, "tool_calls": [CALL]}
    assert sent["messages"][2]["tool_call_id"] == "call_1"
    last = outputs[-1]
    assert last.finish_reason == "tool_calls" and "".join(o.text for o in outputs) == ""
    assert last.tool_calls == [
        {
            "id": "call_up",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    assert (last.prompt_tokens, last.completion_tokens) == (20, 9)
