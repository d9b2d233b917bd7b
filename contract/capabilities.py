"""What an engine and its model can do beyond plain sampling, as a worker announces it.

Each worker's heartbeat lists its engine's capabilities by name. A model can do what every one
of its live workers can do (the intersection): a request of that model is read from the
model's shared stream by whichever of them has a free slot first, so a capability that only
some of them have would be honoured or dropped by chance. A worker of an older release
announces none, so during a rolling upgrade a model offers these features only once all its
workers can serve them.

The web asks `first_missing` before it submits a request (a 400 naming the parameter); the
engine asks `refuse_missing` before it runs one, for a worker that joined meanwhile: a request
is refused, never answered as if the parameter had not been sent.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

JSON_OBJECT = "json_object"  # response_format {"type": "json_object"}
JSON_SCHEMA = "json_schema"  # response_format {"type": "json_schema", ...}, enforced
SEED = "seed"
PENALTIES = "penalties"  # presence_penalty and frequency_penalty
TOOLS = "tools"  # tools, tool_choice, parallel_tool_calls; tool calls and results replayed
LOGPROBS = "logprobs"  # logprobs and top_logprobs
LOGIT_BIAS = "logit_bias"
# n > 1: the web runs n requests of the model and merges them (apps/api/openai_choices.py), so
# a model can when its workers can seed each choice apart: every engine that samples.
N = "n"
# image_url content parts: a vLLM multimodal model, or an upstream its operator says reads them.
IMAGE_INPUT = "image_input"

ALL = (JSON_OBJECT, JSON_SCHEMA, SEED, PENALTIES, TOOLS, LOGPROBS, LOGIT_BIAS, N, IMAGE_INPUT)
# What every engine that enforces structured output and honours sampling parameters offers.
SAMPLING_AND_STRUCTURED = frozenset({JSON_OBJECT, JSON_SCHEMA, SEED, PENALTIES})

# What each capability is called in a refusal.
WHAT = {
    JSON_OBJECT: 'JSON mode (response_format {"type": "json_object"})',
    JSON_SCHEMA: 'structured output (response_format {"type": "json_schema"})',
    SEED: "seeded sampling (seed)",
    PENALTIES: "presence and frequency penalties",
    TOOLS: "tools and function calling",
    LOGPROBS: "log probabilities (logprobs, top_logprobs)",
    LOGIT_BIAS: "logit_bias",
    N: "more than one choice per request (n)",
    IMAGE_INPUT: "image input (image_url content parts)",
}


# The code of an answer its engine refused: the request's fault, not the worker's (it does not
# count against the worker's circuit breaker), and a 400 to an API client.
REFUSED_CODE = "engine_refused"


class EngineRefused(ValueError):
    """The engine cannot serve the request as asked; the message says why, for its client."""


class CapabilityMissing(EngineRefused):
    """A request asked for something its engine cannot do; the message names the parameter."""

    def __init__(self, param: str, capability: str) -> None:
        self.param, self.capability = param, capability
        super().__init__(f"this worker's engine cannot serve `{param}`: {describe(capability)}")


def describe(capability: str) -> str:
    return WHAT.get(capability, capability)


def asked(request: Any) -> dict[str, str]:
    """The capabilities a request needs, by the parameter that asks for each. `request` is a
    work item or an engine request (both carry response_format, seed, the penalties and the
    tools); a parameter at its neutral value asks for nothing."""
    needs: dict[str, str] = {}
    if request.tools:
        needs["tools"] = TOOLS
    else:  # a conversation that replays calls or their results, without tools now
        for index, message in enumerate(request.messages):
            if message.get("role") == "tool":
                needs[f"messages[{index}].role"] = TOOLS
                break
            if message.get("tool_calls"):
                needs[f"messages[{index}].tool_calls"] = TOOLS
                break
    kind = (request.response_format or {}).get("type")
    if kind in (JSON_OBJECT, JSON_SCHEMA):
        needs["response_format"] = kind
    if request.seed is not None:
        needs["seed"] = SEED
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(request, name):
            needs[name] = PENALTIES
    # Read with getattr: an engine request has no `n` (each choice is its own request).
    if getattr(request, "logprobs", None) is not None:
        needs["logprobs"] = LOGPROBS
    if getattr(request, "logit_bias", None):
        needs["logit_bias"] = LOGIT_BIAS
    if getattr(request, "n", 1) > 1:
        needs["n"] = N
    image = first_image(request.messages)
    if image is not None:
        needs[image] = IMAGE_INPUT
    return needs


def first_image(messages: list[dict[str, Any]]) -> str | None:
    """Where the first image of a conversation is (`messages[i].content[j].image_url`), or
    None. A message with images keeps its parts, in OpenAI's shape, in `parts`."""
    for index, message in enumerate(messages):
        for at, part in enumerate(message.get("parts") or ()):
            if part.get("type") == "image_url":
                return f"messages[{index}].content[{at}].image_url"
    return None


def first_missing(needs: Mapping[str, str], have: Collection[str]) -> tuple[str, str] | None:
    """The first (parameter, capability) of `needs` that `have` lacks, or None."""
    for param, capability in needs.items():
        if capability not in have:
            return param, capability
    return None


def refuse_missing(request: Any, have: Collection[str]) -> None:
    """Raises CapabilityMissing when `request` asks for what `have` lacks."""
    missing = first_missing(asked(request), have)
    if missing is not None:
        raise CapabilityMissing(*missing)


def announced(beat: Mapping[str, Any]) -> frozenset[str]:
    """The capabilities a heartbeat lists (none from a worker that predates them)."""
    listed = beat.get("capabilities")
    if not isinstance(listed, list):
        return frozenset()
    return frozenset(name for name in listed if isinstance(name, str))


def of_models(beats: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, frozenset[str]]:
    """model → what all of its workers can do, from (model, heartbeat) pairs of its live
    workers."""
    models: dict[str, frozenset[str]] = {}
    for model, beat in beats:
        have = announced(beat)
        models[model] = models[model] & have if model in models else have
    return models


def table(have: Collection[str]) -> dict[str, bool]:
    """Every capability, true or false: what /v1/models shows for a model."""
    return {name: name in have for name in ALL}
