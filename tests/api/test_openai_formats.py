"""How a chat completion's response format, seed and penalties are read: into the form the
work item carries, or a 400 naming the parameter (before any model is looked at)."""

from __future__ import annotations

import pytest

from apps.api.openai_errors import ApiError
from apps.api.openai_formats import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH, response_format_of
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
