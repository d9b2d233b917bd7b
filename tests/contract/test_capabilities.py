"""What a request asks of its engine, what a model's workers can serve together, and the work
item fields that carry it: additive, so a worker of the previous release reads a plain request's
entry exactly as before."""

from __future__ import annotations

import pytest

from contract import capabilities
from contract.capabilities import (
    JSON_OBJECT,
    JSON_SCHEMA,
    PENALTIES,
    SAMPLING_AND_STRUCTURED,
    SEED,
    CapabilityMissing,
)
from contract.protocol import WorkItem
from worker.engines.base import EngineRequest
from worker.engines.llamacpp import LlamaCppEngine
from worker.engines.openai import OpenAIEngine
from worker.engines.simulated import SimulatedEngine
from worker.engines.vllm import VLLMEngine

SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "person",
        "schema": {"type": "object", "properties": {"name": {"type": "string"}}},
        "strict": True,
    },
}
HI = [{"role": "user", "content": "hi"}]
# The fields a work item of the release before these parameters carried.
PREVIOUS_FIELDS = {
    "id",
    "user_id",
    "conversation_id",
    "messages",
    "max_tokens",
    "temperature",
    "prompt_tokens_estimate",
    "kind",
    "submitted_ms",
    "v",
    "model",
    "top_p",
    "stop",
    "purpose",
}


def item(**asked) -> WorkItem:
    return WorkItem(id="r1", user_id="1", conversation_id="", messages=HI, **asked)


def test_a_request_asks_for_what_its_parameters_need_and_nothing_at_neutral_values():
    assert capabilities.asked(item()) == {}
    assert capabilities.asked(item(presence_penalty=0.0, frequency_penalty=0.0)) == {}
    assert capabilities.asked(item(response_format={"type": "json_object"})) == {
        "response_format": JSON_OBJECT
    }
    asked = capabilities.asked(item(response_format=SCHEMA, seed=0, frequency_penalty=0.5))
    assert asked == {"response_format": JSON_SCHEMA, "seed": SEED, "frequency_penalty": PENALTIES}


def test_the_first_missing_capability_is_named_by_its_parameter():
    needs = {"response_format": JSON_SCHEMA, "seed": SEED}
    assert capabilities.first_missing(needs, SAMPLING_AND_STRUCTURED) is None
    assert capabilities.first_missing(needs, {JSON_SCHEMA}) == ("seed", SEED)
    assert capabilities.first_missing(needs, set()) == ("response_format", JSON_SCHEMA)


def test_a_model_can_do_what_all_of_its_workers_can():
    full = {"capabilities": sorted(SAMPLING_AND_STRUCTURED)}
    older = {}  # a worker of the previous release announces nothing
    seeds_only = {"capabilities": [SEED, "a-name-from-a-later-release"]}
    models = capabilities.of_models(
        [("alpha", full), ("alpha", older), ("beta", full), ("beta", seeds_only), ("gamma", full)]
    )
    assert models["alpha"] == frozenset()
    assert models["beta"] == {SEED}
    assert models["gamma"] == SAMPLING_AND_STRUCTURED
    # A garbled list is no capability rather than an error.
    assert capabilities.of_models([("m", {"capabilities": "seed"})]) == {"m": frozenset()}


def test_the_table_lists_every_capability_true_or_false():
    table = capabilities.table(SAMPLING_AND_STRUCTURED)
    assert list(table) == list(capabilities.ALL)
    assert table[JSON_SCHEMA] and table[SEED] and table[PENALTIES]
    assert not any(table[name] for name in ("tools", "logprobs", "n", "image_input"))


def test_the_new_fields_travel_in_the_work_item_and_read_back():
    sent = item(response_format=SCHEMA, seed=-7, presence_penalty=0.5, frequency_penalty=-1.0)
    fields = sent.to_fields()
    assert all(isinstance(v, str) for v in fields.values())
    back = WorkItem.from_fields(fields)
    assert back.response_format == SCHEMA
    assert (back.seed, back.presence_penalty, back.frequency_penalty) == (-7, 0.5, -1.0)
    assert WorkItem.from_fields(item(seed=0).to_fields()).seed == 0


def test_a_plain_request_is_the_entry_the_previous_release_wrote_and_read():
    fields = item(top_p=0.9).to_fields()
    assert set(fields) == PREVIOUS_FIELDS  # nothing new for an older worker to misread
    # An entry written by the previous release reads with the new parameters unset.
    old = {k: v for k, v in item().to_fields().items() if k in PREVIOUS_FIELDS}
    read = WorkItem.from_fields(old)
    assert read.response_format == {} and read.seed is None
    assert read.presence_penalty is None and read.frequency_penalty is None


def test_every_engine_announces_its_capabilities():
    scores = {capabilities.LOGPROBS, capabilities.LOGIT_BIAS, capabilities.N}
    assert VLLMEngine.capabilities == SAMPLING_AND_STRUCTURED | scores
    for engine_class in (LlamaCppEngine, OpenAIEngine):
        assert engine_class.capabilities == SAMPLING_AND_STRUCTURED | scores | {capabilities.TOOLS}
    assert SimulatedEngine.capabilities == frozenset()  # a timing model honours none of them
    assert capabilities.IMAGE_INPUT not in LlamaCppEngine.capabilities | OpenAIEngine.capabilities


def test_logprobs_logit_bias_and_n_are_asked_for_only_away_from_their_neutral_values():
    assert capabilities.asked(item(logprobs=None, logit_bias={})) == {}
    assert capabilities.asked(item(logprobs=0)) == {"logprobs": capabilities.LOGPROBS}
    assert capabilities.asked(item(logit_bias={"42": -5.0})) == {
        "logit_bias": capabilities.LOGIT_BIAS
    }
    # n lives on the API's request only: each choice's work item is a request of its own.
    assert not hasattr(item(), "n")


def test_logprobs_and_logit_bias_travel_in_the_work_item_only_when_asked():
    plain = item().to_fields()
    assert "logprobs" not in plain and "logit_bias" not in plain
    back = WorkItem.from_fields(item(logprobs=0, logit_bias={"42": -100.0}).to_fields())
    assert back.logprobs == 0  # asked, with no alternatives: not the same as not asked
    assert back.logit_bias == {"42": -100.0}
    assert WorkItem.from_fields(item(logprobs=5).to_fields()).logprobs == 5


@pytest.mark.parametrize(
    ("asked", "param"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"seed": 3}, "seed"),
        ({"presence_penalty": 1.0}, "presence_penalty"),
        ({"logprobs": 2}, "logprobs"),
        ({"logit_bias": {"7": 1.0}}, "logit_bias"),
    ],
)
async def test_the_simulated_engine_refuses_what_it_cannot_do_naming_the_parameter(asked, param):
    engine = SimulatedEngine(tokens=2, first_token_ms=0, decode_ms_per_token=0)
    with pytest.raises(CapabilityMissing) as raised:
        async for _ in engine.generate(EngineRequest(id="r", messages=HI, **asked)):
            pass
    assert raised.value.param == param and f"`{param}`" in str(raised.value)
    # Plain requests still run.
    outputs = [o async for o in engine.generate(EngineRequest(id="p", messages=HI))]
    assert "".join(o.text for o in outputs)
