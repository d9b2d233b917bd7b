"""The Responses API through the `openai` SDK against the whole service, answered by the
llama.cpp demo model (SmolLM2-135M): `responses.create` (its text, its usage, and the usage row
filed under the key like any API answer), `responses.parse` with a Pydantic model (whole and
streamed), a streamed response's events in OpenAI's order, the tool loop (a function call, its
output sent back, an answer in words); a client that leaves a stream stops the answer; what
needs a stored response is refused clearly, and a model whose workers cannot serve a parameter
refuses it naming the Responses parameter."""

from __future__ import annotations

import json

import openai
import pytest

from apps.accounts.models import ApiKey
from apps.accounts.services import api_key_hash
from apps.usage.models import RequestUsage
from tests.api.test_structured_outputs import SMOL, Person, demo, sdk  # noqa: F401 (a fixture)
from tests.api.test_tools import RESULT, city_of
from tests.api.test_tools import WEATHER as CHAT_WEATHER
from tests.chat.test_openai_api import (  # noqa: F401 (alpha_single_slot: a fixture)
    alpha_single_slot,
    wait_for_stopped_engine,
)
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ALICE = "Alice is 31 years old. Reply with her name and age."
PARIS = "What's the weather in Paris?"
# The chat tests' function, in the Responses shape (flat): the same prompt, the same answers.
WEATHER = {"type": "function", **CHAT_WEATHER["function"]}


def test_create_answers_with_text_and_usage_filed_like_any_api_answer(demo, key):  # noqa: F811
    client = sdk(demo, key)
    raw = client.responses.with_raw_response.create(
        model=SMOL,
        instructions="You are a helpful assistant.",
        input="What is the capital of France?",
        max_output_tokens=48,
        temperature=0.0,
    )
    response = raw.parse()
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete") and response.model == SMOL
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text.strip()
    usage = response.usage
    assert usage.input_tokens > 5 and 0 < usage.output_tokens <= 48
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens

    # Recorded as any OpenAI API answer is: one usage row, filed under the key.
    request_id = raw.headers["x-request-id"]
    wait_until(
        lambda: RequestUsage.objects.filter(request_id=request_id).exists(),
        what="the answer's usage row",
    )
    row = RequestUsage.objects.get(request_id=request_id)
    assert row.kind == "api" and row.api_key_id == ApiKey.objects.get(key_hash=api_key_hash(key)).id
    assert row.completion_tokens == usage.output_tokens

    # Nothing is stored: nothing to fetch, nothing to continue from.
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    for options, param in (
        ({"previous_response_id": response.id}, "previous_response_id"),
        ({"store": True}, "store"),
    ):
        with pytest.raises(openai.BadRequestError) as raised:
            client.responses.create(model=SMOL, input="And of Spain?", **options)
        assert raised.value.param == param and "stores no responses" in raised.value.message


def test_parse_returns_a_valid_object_whole_and_streamed(demo, key):  # noqa: F811
    client = sdk(demo, key)
    parsed = client.responses.parse(
        model=SMOL, input=ALICE, text_format=Person, max_output_tokens=64, temperature=0.0
    )
    assert parsed.status == "completed"
    person = parsed.output_parsed
    assert isinstance(person, Person) and "Alice" in person.name
    assert person == Person.model_validate_json(parsed.output_text)

    with client.responses.stream(
        model=SMOL, input=ALICE, text_format=Person, max_output_tokens=64, temperature=0.0
    ) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.output_parsed == person and "".join(deltas) == parsed.output_text


def test_a_streamed_response_sends_openais_events_in_order(demo, key):  # noqa: F811
    stream = sdk(demo, key).responses.create(
        model=SMOL,
        input="Tell me a short story about a lighthouse.",
        max_output_tokens=32,
        temperature=0.0,
        stream=True,
    )
    events = list(stream)
    kinds = [event.type for event in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas > 1  # streamed as it was written, not in one piece at the end
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete" if kinds[-1] == "response.incomplete" else "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    final = events[-1].response
    assert text.strip() and text == final.output_text == events[-4].text
    assert final.usage.output_tokens > 1 and final.id == events[0].response.id


def test_the_tool_loop_calls_the_function_then_answers_with_its_output(demo, key):  # noqa: F811
    client = sdk(demo, key)
    called = client.responses.create(
        model=SMOL,
        input=PARIS,
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0.0,
    )
    (call,) = called.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and call.status == "completed"
    assert "paris" in city_of(call.arguments).lower()

    # The loop: the call as the SDK returned it, then the function's output.
    answered = client.responses.create(
        model=SMOL,
        input=[
            {"role": "user", "content": PARIS},
            *called.output,
            {"type": "function_call_output", "call_id": call.call_id, "output": RESULT},
        ],
        tools=[WEATHER],
        temperature=0.0,
        max_output_tokens=60,
    )
    assert [item.type for item in answered.output] == ["message"]
    assert "sunny" in answered.output_text.lower()  # it read the output

    # Streamed, the call arrives as its item with its arguments' events.
    stream = client.responses.create(
        model=SMOL,
        input=PARIS,
        tools=[WEATHER],
        tool_choice="required",
        temperature=0.0,
        stream=True,
    )
    events = list(stream)
    done = [event for event in events if event.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == json.loads(call.arguments)
    assert events[-1].type == "response.completed"
    assert events[-1].response.output[0].type == "function_call"


def test_a_model_that_cannot_serve_a_parameter_refuses_it_by_its_responses_name(demo, key):  # noqa: F811
    client = sdk(demo, key)
    schema = {"type": "json_schema", "name": "p", "schema": {"type": "object"}}
    for options, param in (
        ({"tools": [WEATHER]}, "tools"),
        ({"text": {"format": schema}}, "text.format"),
    ):
        with pytest.raises(openai.BadRequestError) as raised:
            client.responses.create(model="alpha", input=PARIS, **options)
        assert raised.value.param == param and raised.value.code == "unsupported_parameter"
        assert "`alpha`" in raised.value.message
    plain = client.responses.create(model="alpha", input=PARIS)
    assert plain.status == "completed" and plain.output_text


def test_a_client_that_leaves_a_streamed_response_stops_the_answer(alpha_single_slot, key):  # noqa: F811
    base, redis_prefix = alpha_single_slot
    stream = sdk(base, key).responses.with_raw_response.create(
        model="alpha", input="Say hi.", max_output_tokens=1900, stream=True
    )
    request_id = stream.headers["x-request-id"]
    deltas = 0
    for event in stream.parse():
        deltas += event.type == "response.output_text.delta"
        if deltas >= 3:
            break
    stream.http_response.close()  # and leave: the connection closes
    final = wait_for_stopped_engine(redis_prefix, request_id)
    assert final["state"] == "cancelled"
    assert json.loads(final["usage"])["completion_tokens"] < 1000  # of 3000: the engine stopped
