"""How a chat completion's tools are read (into the form the work item carries, or a 400 naming
the parameter, before any model is looked at), and how the calls an answer makes reach the
client: in the message, or as `tool_calls` deltas in OpenAI's chunk shape."""

from __future__ import annotations

import json

import pytest

from apps.api.openai_errors import ApiError
from apps.api.openai_shapes import Chunks, chat_request, completion
from apps.api.openai_tools import MAX_TOOLS

HI = [{"role": "user", "content": "What's the weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    },
}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def refused(body: dict) -> ApiError:
    with pytest.raises(ApiError) as raised:
        chat_request({"model": "m", "messages": HI, **body})
    assert raised.value.status == 400 and raised.value.message
    return raised.value


def test_tools_and_tool_choice_read_into_what_the_work_item_carries():
    asked = chat_request({"model": "m", "messages": HI, "tools": [WEATHER]})
    assert asked.tools == [WEATHER] and asked.tool_choice is None
    bare = {"type": "function", "function": {"name": "now"}}
    asked = chat_request(
        {
            "model": "m",
            "messages": HI,
            "tools": [WEATHER, bare],
            "tool_choice": {"type": "function", "function": {"name": "now"}},
            "parallel_tool_calls": False,
        }
    )
    assert asked.tools[1] == {"type": "function", "function": {"name": "now"}}
    assert asked.tool_choice == {"type": "function", "function": {"name": "now"}}
    assert asked.parallel_tool_calls is False
    for choice in ("auto", "required", "none"):
        assert (
            chat_request(
                {"model": "m", "messages": HI, "tools": [WEATHER], "tool_choice": choice}
            ).tool_choice
            == choice
        )
    # No tools, and a choice that asks for none: a plain request.
    plain = chat_request({"model": "m", "messages": HI, "tools": [], "tool_choice": "none"})
    assert plain.tools == []
    # The tools' text counts toward the prompt's estimate (caps and charges see it).
    assert (
        asked.prompt_tokens_estimate
        > chat_request({"model": "m", "messages": HI}).prompt_tokens_estimate
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": {"name": "f"}}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}] * (MAX_TOOLS + 1)}, "tools"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
        (
            {"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
            "tools[0].function.name",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f" * 65}}]},
            "tools[0].function.name",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "color": 1}}]},
            "tools[0].function.color",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "description": 3}}]},
            "tools[0].function.description",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]},
            "tools[0].function.strict",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
        (
            {
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": {"name": "other"}},
            },
            "tool_choice",
        ),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
def test_malformed_tools_are_a_400_naming_the_parameter(body, param):
    assert refused(body).param == param


def test_a_deep_or_huge_parameters_schema_is_refused():
    deep: dict = {"type": "object"}
    for _ in range(30):
        deep = {"type": "object", "properties": {"x": deep}}
    tool = {"type": "function", "function": {"name": "f", "parameters": deep}}
    assert refused({"tools": [tool]}).param == "tools[0].function.parameters"
    big = {"type": "object", "description": "x" * 40_000}
    tool = {"type": "function", "function": {"name": "f", "parameters": big}}
    assert "bytes" in refused({"tools": [tool]}).message


def test_the_legacy_functions_are_refused_saying_what_to_send():
    functions = [{"name": "get_weather", "parameters": {"type": "object"}}]
    error = refused({"functions": functions})
    assert error.param == "functions" and error.code == "unsupported_parameter"
    assert "`tools`" in error.message
    assert refused({"function_call": {"name": "get_weather"}}).param == "function_call"
    legacy = [*HI, {"role": "function", "name": "get_weather", "content": "sunny"}]
    assert refused({"messages": legacy}).param == "messages[1].role"


def test_calls_and_results_are_replayed_in_the_conversation():
    messages = [
        *HI,
        {"role": "assistant", "content": None, "tool_calls": [CALL], "refusal": None},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "18C"}]},
    ]
    asked = chat_request({"model": "m", "messages": messages, "tools": [WEATHER]})
    assert asked.messages[1] == {"role": "assistant", "content": "", "tool_calls": [CALL]}
    assert asked.messages[2] == {"role": "tool", "content": "18C", "tool_call_id": "call_1"}
    # The SDK's replay of a plain answer (empty tool_calls) is a plain message.
    replay = [*HI, {"role": "assistant", "content": "Hi.", "tool_calls": [], "function_call": None}]
    assert chat_request({"model": "m", "messages": replay}).messages[1] == {
        "role": "assistant",
        "content": "Hi.",
    }
    for message, param in (
        ({"role": "tool", "content": "18C"}, "messages[1].tool_call_id"),
        ({"role": "assistant", "tool_calls": [{"id": "c"}]}, "messages[1].tool_calls[0]"),
        ({"role": "assistant", "tool_calls": "call"}, "messages[1].tool_calls"),
        ({"role": "user", "content": "x", "tool_call_id": "c"}, "messages[1].tool_call_id"),
        ({"role": "assistant", "content": None}, "messages[1].content"),
    ):
        assert refused({"messages": [*HI, message]}).param == param


def test_an_answer_that_calls_tools_reads_as_openais():
    whole = completion(
        request_id="r",
        model="m",
        created=1,
        text="",
        finish_reason="tool_calls",
        usage={"prompt_tokens": 5, "completion_tokens": 9},
        tool_calls=[CALL],
    )
    (choice,) = whole["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [CALL] and choice["message"]["content"] is None
    assert whole["usage"]["completion_tokens"] == 9
    plain = completion(
        request_id="r", model="m", created=1, text="Hi", finish_reason="stop", usage={}
    )
    assert "tool_calls" not in plain["choices"][0]["message"]

    chunks = Chunks(request_id="r", model="m", created=1, include_usage=False)
    second = {**CALL, "id": "call_2", "function": {"name": "now", "arguments": "{}"}}
    lines = [line[6:] for line in chunks.calls([CALL, second]).split("\n\n") if line]
    deltas = [json.loads(line)["choices"][0]["delta"]["tool_calls"] for line in lines]
    # Per call: its index, id, type and name first, then its arguments.
    assert deltas[0] == [
        {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        }
    ]
    assert deltas[1] == [{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]
    assert deltas[2][0]["index"] == 1 and deltas[2][0]["id"] == "call_2"
    assert '"finish_reason":"tool_calls"' in chunks.finish("tool_calls", {}).replace(" ", "")
