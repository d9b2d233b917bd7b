"""The OpenAI API beyond plain chat, answered by vLLM's CPU build: the `openai` SDK's tool loop
through vLLM's hermes tool parser, `chat.completions.parse` held to a Pydantic model by vLLM's
structured outputs, log probabilities in a stream; and what the text-only demo model cannot
read (an image) refused with a 400 naming the part. The whole service runs (daphne, the
dispatcher) in the main venv, against the `--engine vllm` worker."""

from __future__ import annotations

import json
import math

import openai
import pytest
from pydantic import BaseModel, Field

from apps.accounts.services import api_key_create
from tests.admission.conftest import force_level
from tests.chat.test_openai_api import roomy

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASKED = {"role": "user", "content": "What is the weather in Paris?"}
# A 1x1 red PNG.
PIXEL = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=150)


@pytest.fixture
def service(live_web, dispatcher, redis_prefix, vllm_worker, user):
    """The whole service in front of the vllm worker; the SDK, and the model's name."""
    force_level(0)  # this machine's own load must not cap or shed the answers
    roomy()
    key = api_key_create(user=user, name="vllm")[1]
    client = openai.OpenAI(base_url=f"{live_web}/v1", api_key=key, timeout=180, max_retries=0)
    return client, vllm_worker.heartbeat()["model"]


def test_the_tool_loop_runs_through_vllms_tool_parser(service):
    client, model = service
    forced = {"type": "function", "function": {"name": "get_weather"}}
    stream = client.chat.completions.create(
        model=model,
        messages=[ASKED],
        tools=[WEATHER],
        tool_choice=forced,
        max_tokens=64,
        temperature=0.0,
        stream=True,
    )
    deltas, finish = [], None
    for chunk in stream:
        for choice in chunk.choices:
            deltas += choice.delta.tool_calls or []
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    first = deltas[0]
    assert (first.index, first.function.name) == (0, "get_weather") and first.id
    arguments = "".join(delta.function.arguments or "" for delta in deltas)
    assert json.loads(arguments)["city"] == "Paris"  # held to the tool's schema, and read

    # The caller runs the tool and sends its result back; the model answers with it.
    call = {
        "id": first.id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }
    answer = client.chat.completions.create(
        model=model,
        messages=[
            ASKED,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": first.id, "content": "Sunny, 21 C"},
        ],
        tools=[WEATHER],
        max_tokens=48,
        temperature=0.0,
    )
    final = answer.choices[0]
    assert final.finish_reason == "stop" and not final.message.tool_calls
    assert "21" in final.message.content or "sunny" in final.message.content.lower()
    assert answer.usage.prompt_tokens > 0 and answer.usage.completion_tokens > 0

    # tool_choice "required": a call of one of the tools, whole, in the answer.
    required = client.chat.completions.create(
        model=model,
        messages=[ASKED],
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=64,
        temperature=0.0,
    )
    (made,) = required.choices[0].message.tool_calls
    assert required.choices[0].finish_reason == "tool_calls"
    assert made.function.name == "get_weather" and "city" in json.loads(made.function.arguments)


def test_parse_returns_a_valid_object_from_vllms_structured_outputs(service):
    client, model = service
    parsed = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Alice is 31. Reply with her name and age."}],
        response_format=Person,
        max_tokens=64,
        temperature=0.0,
    )
    choice = parsed.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)  # the SDK validated it against the schema
    assert choice.message.parsed == Person.model_validate_json(choice.message.content)


def test_logprobs_stream_with_each_chunk(service):
    client, model = service
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16,
        temperature=0.0,
        logprobs=True,
        top_logprobs=2,
        stream=True,
    )
    text, entries = "", []
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs is not None:
                entries += choice.logprobs.content
    assert text.strip() and entries
    assert "".join(entry.token for entry in entries) == text  # one entry per token sent
    for entry in entries:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        best = entry.top_logprobs[0].logprob
        # Greedy: the token taken is the likeliest one.
        assert math.isclose(entry.logprob, best, abs_tol=1e-3)


def test_a_text_only_model_refuses_an_image_naming_the_part(service):
    client, model = service
    listed = client.models.retrieve(model).model_extra["capabilities"]
    assert listed["tools"] and listed["json_schema"] and listed["logprobs"]
    assert listed["image_input"] is False  # SmolLM2 is not multimodal: vLLM's config says so
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=model,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is in this picture?"},
                        {"type": "image_url", "image_url": {"url": PIXEL}},
                    ],
                }
            ],
            max_tokens=8,
        )
    error = raised.value.body
    assert error["param"] == "messages[0].content[1].image_url"
    assert error["code"] == "unsupported_parameter"
