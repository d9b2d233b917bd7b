"""How a Responses API request is read into the chat completion it amounts to (or a 400 naming
the Responses parameter), and how the answer is told back: the `response` object and its
stream's events, checked against the `openai` SDK's own types."""

from __future__ import annotations

import json

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from apps.api.openai_errors import ApiError, invalid
from apps.api.responses_request import Echo, renamed, responses_request
from apps.api.responses_shapes import ResponseEvents, completed

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
USAGE = {"prompt_tokens": 12, "completion_tokens": 5, "cached_tokens": 4}


def refused(body: dict) -> ApiError:
    with pytest.raises(ApiError) as raised:
        responses_request(body)
    assert raised.value.status == 400
    return raised.value


def test_a_string_input_with_instructions_is_a_system_and_a_user_message():
    asked, echo = responses_request(
        {"model": "smol", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 20}
    )
    assert asked.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    assert asked.model == "smol" and asked.max_tokens == 20 and asked.n == 1
    assert echo.instructions == "Be brief." and echo.max_output_tokens == 20


def test_input_items_become_messages_calls_and_tool_results():
    asked, _ = responses_request(
        {
            "input": [
                {"role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
                {"type": "message", "role": "user", "content": "Weather in Paris?"},
                {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city": "Paris"}',
                    "status": "completed",
                },
                {"type": "function_call_output", "call_id": "call_1", "output": '{"sky": "sunny"}'},
                {
                    "type": "message",
                    "id": "msg_1",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}],
                },
            ],
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "name": "get_weather"},
        }
    )
    system, user, call, result, answer = asked.messages
    assert system == {"role": "system", "content": "Use tools."}
    assert user == {"role": "user", "content": "Weather in Paris?"}
    assert call["role"] == "assistant" and call["content"] == ""
    assert call["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    assert result == {"role": "tool", "content": '{"sky": "sunny"}', "tool_call_id": "call_1"}
    assert answer == {"role": "assistant", "content": "Sunny."}
    assert asked.tools == [
        {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    ]
    assert asked.tool_choice == {"type": "function", "function": {"name": "get_weather"}}


def test_text_format_becomes_the_response_format():
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    spec = {"type": "json_schema", "name": "person", "schema": schema, "strict": True}
    asked, echo = responses_request({"input": "Hi", "text": {"format": spec}})
    assert asked.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": schema, "strict": True},
    }
    assert echo.text == {"format": spec}
    asked, _ = responses_request({"input": "Hi", "text": {"format": {"type": "json_object"}}})
    assert asked.response_format == {"type": "json_object"}
    asked, _ = responses_request({"input": "Hi", "text": {"format": {"type": "text"}}})
    assert asked.response_format == {}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "Hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "Hi", "conversation": "conv_1"}, "conversation"),
        ({"input": "Hi", "store": True}, "store"),
        ({"input": "Hi", "background": True}, "background"),
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "Hi", "tools": [{**WEATHER, "name": "no spaces"}]}, "tools[0].name"),
        ({"input": "Hi", "text": {"format": {"type": "json_schema"}}}, "text.format.name"),
        ({"input": "Hi", "text": {"format": {"type": "xml"}}}, "text.format"),
        ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "Hi", "temperature": 3}, "temperature"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": []}, "input"),
        ({"model": "smol"}, "input"),
        ({"input": "Hi", "seed": 1}, "seed"),  # not a Responses parameter
    ],
)
def test_what_sluice_does_not_do_is_a_400_naming_the_responses_parameter(body, param):
    error = refused(body)
    assert error.param == param, error.message


def test_store_false_and_neutral_values_are_taken():
    asked, echo = responses_request(
        {
            "input": "Hi",
            "store": False,
            "truncation": "disabled",
            "include": [],
            "metadata": {"trace": "1"},
            "user": "u-1",
            "parallel_tool_calls": False,
        }
    )
    assert asked.messages == [{"role": "user", "content": "Hi"}]
    assert echo.metadata == {"trace": "1"} and echo.parallel_tool_calls is False


def test_errors_raised_on_the_chat_path_name_the_responses_parameter():
    error = renamed(invalid("max_tokens", "`max_tokens` is too large."))
    assert error.param == "max_output_tokens" and "`max_output_tokens`" in error.message
    assert renamed(invalid("messages[2].tool_calls", "no tools")).param == "input"
    assert renamed(invalid("response_format", "x")).param == "text.format"


def test_the_response_object_is_what_the_sdk_reads():
    echo = Echo(tools=[WEATHER])
    whole = completed(
        request_id="r1",
        model="smol",
        created=1,
        echo=echo,
        text="Hello",
        calls=[],
        finish_reason="stop",
        usage=USAGE,
    )
    response = Response.model_validate(whole)
    assert response.output_text == "Hello" and response.status == "completed"
    assert response.id == "resp_r1"
    assert response.usage.input_tokens == 12 and response.usage.total_tokens == 17
    assert response.usage.input_tokens_details.cached_tokens == 4

    cut = completed(
        request_id="r2",
        model="smol",
        created=1,
        echo=echo,
        text="",
        calls=[CALL],
        finish_reason="tool_calls",
        usage=USAGE,
    )
    (call,) = Response.model_validate(cut).output
    assert call.type == "function_call" and call.call_id == "call_1"
    assert call.name == "get_weather" and call.arguments == "{}"
    short = completed(
        request_id="r3",
        model="smol",
        created=1,
        echo=echo,
        text="Hel",
        calls=[],
        finish_reason="length",
        usage=USAGE,
    )
    assert Response.model_validate(short).incomplete_details.reason == "max_output_tokens"


def parsed_events(sse: str) -> list:
    adapter = TypeAdapter(ResponseStreamEvent)
    events = []
    for block in sse.strip().split("\n\n"):
        kind, data = block.split("\n")
        event = adapter.validate_python(json.loads(data.removeprefix("data: ")))
        assert kind == f"event: {event.type}"
        events.append(event)
    return events


def test_a_streamed_response_sends_openais_events_in_order():
    events = ResponseEvents(request_id="r1", model="smol", created=1, echo=Echo())
    sse = events.role() + events.text("Hel") + events.text("lo") + events.finish("stop", USAGE)
    parsed = parsed_events(sse)
    assert [event.type for event in parsed] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in parsed] == list(range(len(parsed)))
    assert parsed[-1].response.output_text == "Hello" == parsed[-4].text
    assert parsed[-1].response.usage.output_tokens == 5


def test_a_streamed_call_sends_its_arguments_events():
    events = ResponseEvents(request_id="r1", model="smol", created=1, echo=Echo())
    parsed = parsed_events(events.calls([CALL]) + events.finish("tool_calls", USAGE))
    assert [event.type for event in parsed][2:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    (call,) = parsed[-1].response.output
    assert call.call_id == "call_1" and call.arguments == "{}"


def test_a_failure_inside_the_stream_is_a_failed_response():
    events = ResponseEvents(request_id="r1", model="smol", created=1, echo=Echo())
    error = ApiError(500, "The worker stopped.", type="server_error", code="answer_failed")
    (*_, failed) = parsed_events(events.text("Hi") + events.error(error))
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.error.message == "The worker stopped."
