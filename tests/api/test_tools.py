"""Tools through the clients people use against the whole service, answered by the llama.cpp
demo model (SmolLM2-135M): the `openai` SDK's tool loop (a call, its result sent back, an answer
in words), the same call streamed as `tool_calls` deltas, `tool_choice: "none"` answering in
words, LangChain's `bind_tools` and LiteLLM's `completion` with tools; a model whose workers
cannot serve tools (the simulated engine) refuses them with a 400 naming the parameter."""

from __future__ import annotations

import json

import litellm
import openai
import pytest
from langchain_openai import ChatOpenAI

from tests.api.test_structured_outputs import SMOL, demo, sdk  # noqa: F401 (demo: a fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PARIS = [{"role": "user", "content": "What's the weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
RESULT = '{"temperature": 18, "sky": "sunny"}'


def city_of(arguments: str) -> str:
    """The call's arguments, checked against WEATHER's schema."""
    parsed = json.loads(arguments)
    assert set(parsed) == {"city"} and isinstance(parsed["city"], str)
    return parsed["city"]


def test_the_sdks_tool_loop_calls_the_tool_then_answers_with_its_result(demo, key):  # noqa: F811
    client = sdk(demo, key)
    called = client.chat.completions.create(
        model=SMOL, messages=PARIS, tools=[WEATHER], tool_choice=NAMED, temperature=0.0
    )
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert call.id.startswith("call_")
    assert "paris" in city_of(call.function.arguments).lower()
    assert called.usage.completion_tokens > 5  # the call's tokens are counted like any other

    # The loop: the call replayed as the SDK returned it, the tool's result after it.
    messages = [
        *PARIS,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": RESULT},
    ]
    final = client.chat.completions.create(
        model=SMOL, messages=messages, tools=[WEATHER], temperature=0.0, max_tokens=60
    )
    answer = final.choices[0]
    assert answer.finish_reason == "stop" and not answer.message.tool_calls
    assert "sunny" in answer.message.content.lower()  # it read the result

    # Streamed, the deltas reassemble into the same call.
    stream = client.chat.completions.create(
        model=SMOL,
        messages=PARIS,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    calls: dict[int, dict] = {}
    reasons, usage = [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for streamed in chunk.choices:
            reasons.append(streamed.finish_reason)
            assert not streamed.delta.content  # a call never leaks into the text
            for delta in streamed.delta.tool_calls or ():
                part = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                part["id"] = delta.id or part["id"]
                part["name"] += delta.function.name or ""
                part["arguments"] += delta.function.arguments or ""
    assert list(calls) == [0] and reasons[-1] == "tool_calls"
    assert calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert city_of(calls[0]["arguments"]) == city_of(call.function.arguments)
    assert usage.completion_tokens > 5


def test_tool_choice_none_answers_in_words(demo, key):  # noqa: F811
    answer = sdk(demo, key).chat.completions.create(
        model=SMOL,
        messages=PARIS,
        tools=[WEATHER],
        tool_choice="none",
        temperature=0.0,
        max_tokens=24,
    )
    choice = answer.choices[0]
    assert choice.message.content.strip() and not choice.message.tool_calls
    assert choice.finish_reason in ("stop", "length")


def test_a_model_without_tools_refuses_them_naming_the_parameter(demo, key):  # noqa: F811
    client = sdk(demo, key)
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="alpha", messages=PARIS, tools=[WEATHER])
    assert raised.value.param == "tools" and raised.value.code == "unsupported_parameter"
    assert "`alpha`" in raised.value.message
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    replayed = [*PARIS, {"role": "assistant", "content": None, "tool_calls": [call]}]
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="alpha", messages=replayed)
    assert raised.value.param == "messages[1].tool_calls"


def test_langchain_bind_tools_and_litellm_completion_with_tools(demo, key):  # noqa: F811
    chat = ChatOpenAI(model=SMOL, base_url=f"{demo}/v1", api_key=key, temperature=0.0)
    bound = chat.bind_tools([WEATHER], tool_choice="get_weather")
    message = bound.invoke("What's the weather in Paris?")
    (call,) = message.tool_calls
    assert call["name"] == "get_weather" and "paris" in call["args"]["city"].lower()

    answer = litellm.completion(
        model=f"openai/{SMOL}",
        api_base=f"{demo}/v1",
        api_key=key,
        messages=PARIS,
        tools=[WEATHER],
        tool_choice="required",
        temperature=0.0,
        max_retries=0,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == "get_weather"
    city_of(choice.message.tool_calls[0].function.arguments)
