"""Structured outputs, seeds and penalties through the `openai` SDK against the whole service,
answered by the llama.cpp demo model (SmolLM2-135M): `chat.completions.parse` with a Pydantic
model, JSON mode, the same seed giving the same text, penalties taken; a model whose workers
cannot serve a parameter (the simulated engine) refuses it with a 400 naming it, and /v1/models
says what each model can do."""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel, Field

from contract.protocol import Keys
from core.redis_client import get_redis
from tests.chat.test_openai_api import start_model
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SMOL = "smol"  # the llama.cpp worker's name for the demo model
ALICE = [{"role": "user", "content": "Alice is 31 years old. Reply with her name and age."}]
SKY = [
    {
        "role": "user",
        "content": 'What colour is the sky? Answer as a JSON object with the key "colour".',
    }
]
STORY = [{"role": "user", "content": "Tell me a short story about a lighthouse."}]


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=150)


@pytest.fixture
def demo(live_web, dispatcher, start_worker, redis_prefix, plan):
    """The demo model on llama.cpp ("smol"), and a simulated worker ("alpha") beside it."""
    start_worker("ws", engine="llamacpp", slots=1, extra=("--served-model-name", SMOL))
    start_model(start_worker, redis_prefix, "wa", "alpha", tokens=6)
    heartbeat = Keys(prefix=redis_prefix).heartbeat("ws")
    wait_until(lambda: get_redis().exists(heartbeat), what="the llama.cpp worker to beat")
    return live_web


def sdk(base_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, timeout=120, max_retries=0)


def test_parse_returns_a_valid_object_and_json_mode_parseable_json(demo, key):
    client = sdk(demo, key)
    parsed = client.chat.completions.parse(
        model=SMOL, messages=ALICE, response_format=Person, max_tokens=64, temperature=0.0
    )
    choice = parsed.choices[0]
    assert choice.finish_reason == "stop"
    person = choice.message.parsed
    assert isinstance(person, Person)  # the SDK validated it against the model's schema
    assert person == Person.model_validate_json(choice.message.content)
    assert "Alice" in person.name  # read from the question, not merely well formed

    whole = client.chat.completions.create(
        model=SMOL,
        messages=SKY,
        response_format={"type": "json_object"},
        max_tokens=96,
        temperature=0.0,
    )
    assert whole.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(whole.choices[0].message.content), dict)

    # Streamed, the chunks add up to the same JSON: the format holds token by token.
    stream = client.chat.completions.create(
        model=SMOL,
        messages=SKY,
        response_format={"type": "json_object"},
        max_tokens=96,
        temperature=0.0,
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert json.loads(text) == json.loads(whole.choices[0].message.content)


def test_the_same_seed_gives_the_same_text_and_penalties_are_taken(demo, key):
    client = sdk(demo, key)

    def story(seed: int, **options) -> str:
        answer = client.chat.completions.create(
            model=SMOL, messages=STORY, max_tokens=32, temperature=1.0, seed=seed, **options
        )
        return answer.choices[0].message.content

    first = story(1234)
    assert first and story(1234) == first
    # Other seeds draw other answers: the seed, not chance, made the two the same.
    assert {story(seed) for seed in (1, 2, 3)} - {first}

    penalised = story(1234, presence_penalty=1.5, frequency_penalty=1.5)
    assert penalised.strip()
    assert penalised != first  # the penalties changed what was sampled


def test_models_say_what_they_can_do_and_a_model_that_cannot_refuses_naming_it(demo, key):
    client = sdk(demo, key)
    models = {m.id: m.model_extra["capabilities"] for m in client.models.list()}
    assert models[SMOL]["json_schema"] and models[SMOL]["json_object"]
    assert models[SMOL]["seed"] and models[SMOL]["penalties"]
    assert models[SMOL]["tools"] and models[SMOL]["logprobs"] and not models[SMOL]["image_input"]
    assert not any(models["alpha"].values())  # the simulated engine honours none of them
    assert client.models.retrieve(SMOL).model_extra["capabilities"] == models[SMOL]

    schema = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}}
    for options, param in (
        ({"response_format": schema}, "response_format"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"seed": 7}, "seed"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ):
        with pytest.raises(openai.BadRequestError) as raised:
            client.chat.completions.create(model="alpha", messages=ALICE, **options)
        assert raised.value.param == param and raised.value.code == "unsupported_parameter"
        assert "`alpha`" in raised.value.message
    # At their neutral values they ask nothing, and alpha answers.
    plain = client.chat.completions.create(
        model="alpha",
        messages=ALICE,
        response_format={"type": "text"},
        presence_penalty=0,
        frequency_penalty=0.0,
    )
    assert plain.choices[0].message.content


def test_langchain_with_structured_output_returns_the_pydantic_object(demo, key):
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model=SMOL, base_url=f"{demo}/v1", api_key=key, temperature=0.0, max_tokens=64
    )
    # LangChain's default: response_format json_schema (strict), parsed into the model.
    structured = chat.with_structured_output(Person, include_raw=True)
    result = structured.invoke(ALICE[0]["content"])
    assert result["parsing_error"] is None
    person = result["parsed"]
    assert isinstance(person, Person) and "Alice" in person.name
    assert person == Person.model_validate_json(result["raw"].content)
    # Its JSON mode too.
    json_mode = chat.with_structured_output(Person, method="json_mode", include_raw=True)
    raw = json_mode.invoke(ALICE[0]["content"] + ' Answer as JSON with "name" and "age".')
    assert isinstance(json.loads(raw["raw"].content), dict)
