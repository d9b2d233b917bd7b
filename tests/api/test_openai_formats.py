"""How a chat completion's response format, seed, penalties, logprobs, logit_bias and n are
read: into the form the work item carries, or a 400 naming the parameter (before any model is
looked at)."""

from __future__ import annotations

import pytest

from apps.api.openai_errors import ApiError
from apps.api.openai_formats import (
    MAX_BIASED_TOKENS,
    MAX_CHOICES,
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH,
    response_format_of,
)
from apps.api.openai_shapes import chat_request

HI = [{"role": "user", "content": "hi"}]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def refused(body: dict) -> ApiError:
    with pytest.raises(ApiError) as raised:
        chat_request({"model": "m", "messages": HI, **body})
    assert raised.value.status == 400 and raised.value.message
    return raised.value


def test_the_formats_read_into_what_the_work_item_carries():
    assert response_format_of(None) == {} and response_format_of({"type": "text"}) == {}
    assert response_format_of({"type": "json_object"}) == {"type": "json_object"}
    spec = {"name": "person", "schema": PERSON, "strict": True, "description": "a person"}
    assert response_format_of({"type": "json_schema", "json_schema": spec}) == {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON, "strict": True},
    }
    asked = chat_request(
        {
            "model": "m",
            "messages": HI,
            "response_format": {"type": "json_schema", "json_schema": spec},
            "seed": 42,
            "presence_penalty": 1,
            "frequency_penalty": -0.5,
        }
    )
    assert asked.response_format["json_schema"]["schema"] == PERSON
    assert (asked.seed, asked.presence_penalty, asked.frequency_penalty) == (42, 1.0, -0.5)
    plain = chat_request({"model": "m", "messages": HI, "response_format": {"type": "text"}})
    assert plain.response_format == {} and plain.seed is None


@pytest.mark.parametrize(
    ("response_format", "param"),
    [
        ("json", "response_format"),
        ({"type": "yaml"}, "response_format"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"schema": PERSON}},
            "response_format.json_schema.name",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "has space", "schema": PERSON}},
            "response_format.json_schema.name",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "p", "schema": ["not", "an object"]}},
            "response_format.json_schema.schema",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "p", "schema": "{}"}},
            "response_format.json_schema.schema",
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": PERSON, "strict": "yes"},
            },
            "response_format.json_schema.strict",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "extra": 1}},
            "response_format.json_schema.extra",
        ),
    ],
)
def test_a_format_sluice_cannot_read_is_a_400_naming_where(response_format, param):
    assert refused({"response_format": response_format}).param == param


def test_a_schema_too_large_or_too_deep_is_a_400_that_says_so():
    properties = {f"field_{n}": {"type": "string", "description": "x" * 64} for n in range(400)}
    large = {"type": "object", "properties": properties}
    error = refused(
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "big", "schema": large},
            }
        }
    )
    assert error.param == "response_format.json_schema.schema"
    assert str(MAX_SCHEMA_BYTES) in error.message

    deep: dict = {"type": "string"}
    for _ in range(MAX_SCHEMA_DEPTH):
        deep = {"type": "object", "properties": {"inner": deep}}
    error = refused(
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "deep", "schema": deep},
            }
        }
    )
    assert error.param == "response_format.json_schema.schema"
    assert "deep" in error.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"seed": True}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"seed": 2**63}, "seed"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": "1"}, "frequency_penalty"),
    ],
)
def test_a_seed_or_penalty_out_of_range_is_a_400_naming_it(body, param):
    assert refused(body).param == param


def test_logprobs_logit_bias_and_n_read_into_what_the_work_items_carry():
    def read(**body):
        return chat_request({"model": "m", "messages": HI, **body})

    plain = read()
    assert (plain.logprobs, plain.logit_bias, plain.n) == (None, {}, 1)
    # Neutral values ask for nothing.
    neutral = read(logprobs=False, top_logprobs=0, logit_bias={}, n=1)
    assert (neutral.logprobs, neutral.logit_bias, neutral.n) == (None, {}, 1)
    assert read(logprobs=True).logprobs == 0  # the tokens' own, no alternatives
    assert read(logprobs=True, top_logprobs=20).logprobs == 20
    assert read(logit_bias={"0042": -100, "7": 2.5}).logit_bias == {"42": -100.0, "7": 2.5}
    assert read(n=MAX_CHOICES).n == MAX_CHOICES


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"logprobs": "yes"}, "logprobs", "true or false"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "0 to 20"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs", "0 to 20"),
        ({"logprobs": True, "top_logprobs": 2.5}, "top_logprobs", "0 to 20"),
        ({"top_logprobs": 3}, "top_logprobs", "`logprobs` must be set to true"),
        ({"logprobs": False, "top_logprobs": 3}, "top_logprobs", "`logprobs` must be set"),
        ({"logit_bias": [1, 2]}, "logit_bias", "object of token ids"),
        ({"logit_bias": {"hello": 5}}, "logit_bias", "'hello'"),
        ({"logit_bias": {"-3": 5}}, "logit_bias", "'-3'"),
        ({"logit_bias": {"12": 101}}, "logit_bias", "logit_bias[12]` must be a number from -100"),
        ({"logit_bias": {"12": -100.5}}, "logit_bias", "from -100 to 100"),
        ({"logit_bias": {"12": "5"}}, "logit_bias", "from -100 to 100"),
        ({"logit_bias": {"12": True}}, "logit_bias", "from -100 to 100"),
        (
            {"logit_bias": {str(i): 1 for i in range(MAX_BIASED_TOKENS + 1)}},
            "logit_bias",
            f"at most {MAX_BIASED_TOKENS}",
        ),
        ({"n": 0}, "n", f"from 1 to {MAX_CHOICES}"),
        ({"n": MAX_CHOICES + 1}, "n", f"from 1 to {MAX_CHOICES}"),
        ({"n": 2.0}, "n", "whole number"),
        ({"n": True}, "n", "whole number"),
    ],
)
def test_logprobs_logit_bias_or_n_out_of_range_is_a_400_naming_it(body, param, says):
    error = refused(body)
    assert error.param == param
    assert says in error.message
