"""Log probabilities, several choices and logit_bias through the `openai` SDK against the whole
service, answered by the llama.cpp demo model (SmolLM2-135M): each token's log probability
with the alternatives asked for, whole and streamed; `n=2` as two choices charged as two
answers, whole and streamed (one [DONE]); a bias that bans the answer's first token or forces
another; a model whose workers cannot serve them (the simulated engine) refuses each with a
400 naming it."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from llama_cpp import Llama

from tests.api.test_structured_outputs import SMOL, demo, sdk  # noqa: F401 (demo: a fixture)
from worker.engines.llamacpp import bundled_model_path

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]
STORY = [{"role": "user", "content": "Tell me a short story about a lighthouse."}]


def token_id(text: str) -> int:
    """The demo model's id of the one token `text` is."""
    vocabulary = Llama(model_path=str(bundled_model_path()), vocab_only=True, verbose=False)
    (token,) = vocabulary.tokenize(text.encode(), add_bos=False, special=False)
    return token


def assert_scores_the_text(entries, text: str, alternatives: int) -> None:
    """Each token's entry: its log probability (≤ 0), its bytes, the alternatives asked for."""
    assert entries, "no tokens scored"
    assert "".join(entry.token for entry in entries) == text
    for entry in entries:
        assert entry.logprob <= 0
        assert bytes(entry.bytes) == entry.token.encode()
        assert len(entry.top_logprobs) == alternatives
        ranked = [alternative.logprob for alternative in entry.top_logprobs]
        assert ranked == sorted(ranked, reverse=True) and all(lp <= 0 for lp in ranked)


def test_logprobs_come_with_the_answer_whole_and_streamed(demo, key):  # noqa: F811
    client = sdk(demo, key)
    whole = client.chat.completions.create(
        model=SMOL, messages=CAPITAL, max_tokens=16, temperature=0.0, logprobs=True, top_logprobs=3
    )
    choice = whole.choices[0]
    assert_scores_the_text(choice.logprobs.content, choice.message.content, 3)
    # Greedy: the token taken is the likeliest in the model's own distribution for the first one
    # (no penalty has anything to act on yet).
    first = choice.logprobs.content[0]
    assert first.token == first.top_logprobs[0].token and first.logprob == pytest.approx(
        first.top_logprobs[0].logprob
    )
    # The token cap cut it: the last token, which no step followed, is scored too.
    assert choice.finish_reason == "length"
    assert len(choice.logprobs.content) == whole.usage.completion_tokens

    stream = client.chat.completions.create(
        model=SMOL,
        messages=STORY,
        max_tokens=24,
        temperature=1.0,
        seed=5,
        logprobs=True,
        top_logprobs=2,
        stream=True,
    )
    text, entries, scored_chunks = "", [], 0
    for chunk in stream:
        (streamed,) = chunk.choices
        text += streamed.delta.content or ""
        if streamed.logprobs is not None:
            scored_chunks += 1
            entries += streamed.logprobs.content
    assert scored_chunks > 1  # per chunk as the tokens come, not only at the end
    assert_scores_the_text(entries, text, 2)

    plain = client.chat.completions.create(model=SMOL, messages=CAPITAL, max_tokens=4)
    assert plain.choices[0].logprobs is None  # asked for nothing, given nothing


def test_n_gives_each_choice_its_index_and_counts_every_answer(demo, key):  # noqa: F811
    client = sdk(demo, key)
    one = client.chat.completions.create(model=SMOL, messages=STORY, max_tokens=8)
    two = client.chat.completions.create(
        model=SMOL, messages=STORY, max_tokens=8, temperature=1.0, n=2, logprobs=True
    )
    assert [choice.index for choice in two.choices] == [0, 1]
    for choice in two.choices:
        assert choice.message.content and choice.finish_reason == "length"
        assert_scores_the_text(choice.logprobs.content, choice.message.content, 0)
    # Charged as two answers: each read the prompt and wrote its 8 tokens.
    assert two.usage.prompt_tokens == 2 * one.usage.prompt_tokens
    assert two.usage.completion_tokens == 16
    assert two.usage.total_tokens == two.usage.prompt_tokens + 16

    # Streamed (raw, to count the ends): chunks of both choices, each choice ends once, the
    # usage once with both counted, and one [DONE], last.
    body = {
        "model": SMOL,
        "messages": STORY,
        "max_tokens": 8,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream(
        "POST",
        f"{demo}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    ) as response:
        assert response.status_code == 200
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines.count("[DONE]") == 1 and lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    texts, ends = {0: "", 1: ""}, {0: [], 1: []}
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["delta"].get("content") or ""
            if choice["finish_reason"]:
                ends[choice["index"]].append(choice["finish_reason"])
    assert texts[0] and texts[1]
    assert ends == {0: ["length"], 1: ["length"]}
    usages = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
    assert len(usages) == 1 and usages[0]["completion_tokens"] == 16
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == usages[0]


def test_logit_bias_bans_or_forces_tokens_and_bad_biases_are_refused(demo, key):  # noqa: F811
    client = sdk(demo, key)

    def answer(**options):
        whole = client.chat.completions.create(
            model=SMOL, messages=CAPITAL, max_tokens=6, temperature=0.0, logprobs=True, **options
        )
        return whole.choices[0]

    said = answer()
    first = said.logprobs.content[0].token
    banned = answer(logit_bias={str(token_id(first)): -100})
    # The token it would have said is gone; the model's own odds of it are still reported.
    assert banned.logprobs.content[0].token != first
    assert banned.message.content != said.message.content
    forced = answer(logit_bias={str(token_id(" banana")): 100})
    assert forced.message.content.startswith(" banana")

    for bias, says in (
        ({"banana": 5}, "token ids"),
        ({"12": 150}, "from -100 to 100"),
        ({"999999": 1}, "vocabulary"),  # the worker knows its model's vocabulary
    ):
        with pytest.raises(openai.BadRequestError) as raised:
            answer(logit_bias=bias)
        assert says in raised.value.message
        if says != "vocabulary":
            assert raised.value.param == "logit_bias"


def test_a_model_that_cannot_serve_them_refuses_each_naming_it(demo, key):  # noqa: F811
    client = sdk(demo, key)
    models = {m.id: m.model_extra["capabilities"] for m in client.models.list()}
    assert models[SMOL]["logprobs"] and models[SMOL]["logit_bias"] and models[SMOL]["n"]
    assert not (
        models["alpha"]["logprobs"] or models["alpha"]["logit_bias"] or models["alpha"]["n"]
    )
    for options, param in (
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
        ({"logit_bias": {"42": -5}}, "logit_bias"),
        ({"n": 2}, "n"),
    ):
        with pytest.raises(openai.BadRequestError) as raised:
            client.chat.completions.create(model="alpha", messages=CAPITAL, **options)
        assert raised.value.param == param
        assert raised.value.code == "unsupported_parameter"
