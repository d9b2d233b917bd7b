"""What a chat completion may ask of the sampler beyond temperature and top_p: a response format
(JSON mode, or a JSON schema the engine enforces), a seed, presence and frequency penalties, log
probabilities, a logit bias, more than one choice. Each is read here into the form the work item
carries, or refused with a 400 naming the parameter; whether the chosen model's workers can
serve it is decided by contract/capabilities.py when the model is known.

Pure functions: no database, no Redis.
"""

from __future__ import annotations

import json
import re

from apps.api.openai_errors import invalid

# A schema is compiled into a grammar by the worker before the answer's first token, and
# travels in the work item: bounded, as every other input is. These are roomy for the schemas
# applications send (OpenAI's own limits are of the same order: 10 levels of objects, each
# level two JSON objects deep with its `properties`, and a few thousand properties).
MAX_SCHEMA_BYTES = 32 * 1024
MAX_SCHEMA_DEPTH = 24  # JSON objects inside one another
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a schema's or a function's
JSON_SCHEMA_FIELDS = ("name", "schema", "strict", "description")
SEED_RANGE = (-(2**63), 2**63 - 1)  # OpenAI's: a signed 64-bit integer
MAX_TOP_LOGPROBS = 20  # OpenAI's bound, and vLLM's default
# Tokens one logit_bias may name, and how far it may push each (OpenAI's range).
MAX_BIASED_TOKENS = 300
BIAS_RANGE = (-100, 100)
# Choices one request may ask for: each is a request of its own on the model's workers, so the
# bound keeps one call from taking a worker's every slot.
MAX_CHOICES = 4


def response_format_of(value) -> dict:
    """The format a request asks for, as the work item carries it: {} for plain text,
    {"type": "json_object"}, or {"type": "json_schema", "json_schema": {...}}."""
    if value is None:
        return {}
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": _json_schema(value.get("json_schema"))}
    raise invalid(
        "response_format",
        "`response_format` must be an object whose `type` is text, json_object or json_schema.",
    )


def named_object(spec, where: str, fields, shape: str) -> str:
    """The `name` of `spec` (a JSON schema's or a function's), checked with its fields: an
    object of `fields` only, whose name is what OpenAI allows (NAME)."""
    if not isinstance(spec, dict):
        raise invalid(where, f"`{where}` must be {shape}.")
    for key in spec:
        if key not in fields:
            raise invalid(f"{where}.{key}", f"Unrecognized field of `{where}`: {key}")
    name = spec.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise invalid(
            f"{where}.name",
            f"`{where}.name` must be 1 to 64 letters, digits, underscores or dashes.",
        )
    return name


def check_response_format(name: str, value) -> None:
    response_format_of(value)


def _json_schema(spec) -> dict:
    where = "response_format.json_schema"
    name = named_object(spec, where, JSON_SCHEMA_FIELDS, "an object with a `name` and a `schema`")
    schema = checked_schema(spec.get("schema", {}), f"{where}.schema")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid(f"{where}.strict", f"`{where}.strict` must be true or false.")
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid(f"{where}.description", f"`{where}.description` must be a string.")
    # Enforced whether or not `strict` is set: the engine's grammar holds to the schema either
    # way, which a client that did not ask for strictness can only welcome.
    return {"name": name, "schema": schema, "strict": bool(strict)}


def checked_schema(schema, where: str) -> dict:
    """A JSON schema a request sends (a response format's, a tool's parameters), within the
    bounds every input has."""
    if not isinstance(schema, dict):
        raise invalid(where, f"`{where}` must be a JSON Schema object.")
    size = len(json.dumps(schema, ensure_ascii=False).encode())
    if size > MAX_SCHEMA_BYTES:
        raise invalid(
            where, f"`{where}` is {size} bytes; the most Sluice takes is {MAX_SCHEMA_BYTES}."
        )
    if _depth(schema) > MAX_SCHEMA_DEPTH:
        raise invalid(where, f"`{where}` nests JSON objects more than {MAX_SCHEMA_DEPTH} deep.")
    return schema


def _depth(schema) -> int:
    """How many JSON objects nest inside one another (a schema, its `properties`, ...)."""
    deepest, pending = 0, [(schema, 1)]
    while pending:
        node, level = pending.pop()
        if isinstance(node, dict):
            deepest = max(deepest, level)
            pending.extend((child, level + 1) for child in node.values())
        elif isinstance(node, list):
            pending.extend((child, level) for child in node)
    return deepest


def check_seed(name: str, value) -> None:
    low, high = SEED_RANGE
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid(name, f"`{name}` must be a whole number (a signed 64-bit integer).")


def check_penalty(name: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not -2 <= value <= 2:
        raise invalid(name, f"`{name}` must be a number from -2 to 2.")


def check_logprobs(name: str, value) -> None:
    if value is not None and not isinstance(value, bool):
        raise invalid(name, "`logprobs` must be true or false.")


def check_top_logprobs(name: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise invalid(name, f"`top_logprobs` must be a whole number from 0 to {MAX_TOP_LOGPROBS}.")


def logprobs_of(logprobs, top_logprobs) -> int | None:
    """How many alternatives each token's log probability comes with, or None when the
    request does not ask for log probabilities."""
    if top_logprobs and not logprobs:
        raise invalid(
            "top_logprobs", "`logprobs` must be set to true when `top_logprobs` is given."
        )
    return (top_logprobs or 0) if logprobs else None


def check_logit_bias(name: str, value) -> None:
    """Token ids (as strings, since JSON keys are) to a bias from -100 to 100. Whether the
    model has such a token is the worker's to say: the web does not know its vocabulary."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise invalid(name, "`logit_bias` must be an object of token ids to biases.")
    if len(value) > MAX_BIASED_TOKENS:
        raise invalid(name, f"`logit_bias` may name at most {MAX_BIASED_TOKENS} tokens.")
    low, high = BIAS_RANGE
    for token, bias in value.items():
        if not (isinstance(token, str) and token.isascii() and token.isdigit()):
            raise invalid(
                name, f"`logit_bias` keys must be token ids (whole numbers); got {token!r}."
            )
        number = isinstance(bias, int | float) and not isinstance(bias, bool)
        if not number or not low <= bias <= high:
            raise invalid(name, f"`logit_bias[{token}]` must be a number from {low} to {high}.")


def logit_bias_of(value) -> dict:
    """The bias as the work item carries it: token id (as a canonical string) -> bias."""
    return {str(int(token)): float(bias) for token, bias in (value or {}).items()}


def check_n(name: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CHOICES:
        raise invalid(name, f"`n` must be a whole number from 1 to {MAX_CHOICES}.")
