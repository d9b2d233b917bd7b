"""OpenAI's answer shapes: what a client's SDK parses."""

from __future__ import annotations

import json

import pytest

from apps.api.openai_errors import ApiError, body_of, context_room
from apps.api.openai_shapes import Chunks, chat_request, completion


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [("stop", "stop"), ("length", "length"), ("loop", "length"), ("", "stop"), (None, "stop")],
)
def test_every_ending_reads_as_one_of_openais_finish_reasons(ours, theirs):
    whole = completion(
        request_id="r1",
        model="m",
        created=1,
        text="hi",
        finish_reason=ours,
        usage={"prompt_tokens": 3, "completion_tokens": 1},
    )
    assert whole["choices"][0]["finish_reason"] == theirs

    lines = Chunks(request_id="r1", model="m", created=1, include_usage=True).finish(ours, {})
    chunks = [json.loads(line[6:]) for line in lines.split("\n\n") if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["finish_reason"] == theirs
    assert chunks[1]["choices"] == [] and chunks[1]["usage"]["total_tokens"] == 0
    assert lines.endswith("data: [DONE]\n\n")


def test_a_body_is_strict_json_and_names_what_is_wrong():
    assert body_of(b'{"text": "\\ud83d\\ude00"}') == {"text": "\N{GRINNING FACE}"}  # a pair
    for raw, reason in [
        (b'{"text": "\\ud800"}', "surrogate"),
        (b'{"t": NaN}', "JSON"),
        (b"[1]", "JSON object"),
        (b"{", "JSON"),
    ]:
        with pytest.raises(ApiError) as caught:
            body_of(raw)
        assert caught.value.status == 400 and reason in caught.value.body()["error"]["message"]


def test_the_window_is_kept_in_openais_words():
    assert context_room(window=100, prompt_tokens=40, asked=None) == 60
    assert context_room(window=100, prompt_tokens=40, asked=60) == 60
    for prompt, asked, words in [
        (100, None, "your messages resulted in 100 tokens"),
        (40, 61, "you requested 101 tokens (40 in the messages, 61 in the completion)"),
    ]:
        with pytest.raises(ApiError) as caught:
            context_room(window=100, prompt_tokens=prompt, asked=asked)
        error = caught.value.body()["error"]
        assert error["message"].startswith("This model's maximum context length is 100 tokens.")
        assert words in error["message"]
        assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")


def test_harmless_fields_are_accepted_and_what_would_change_the_answer_is_not():
    replayed = {"role": "assistant", "content": "Hi.", "refusal": None, "annotations": []}
    asked = chat_request(
        {
            "messages": [{"role": "user", "content": "Hi"}, replayed],
            "safety_identifier": "u7",
            "prompt_cache_key": "c3",
            "verbosity": "high",
            "top_logprobs": 0,
        }
    )
    assert asked.messages[1] == {"role": "assistant", "content": "Hi."}
    for body, param in [
        ({"top_logprobs": 1}, "top_logprobs"),
        ({"verbosity": "max"}, "verbosity"),
        ({"prompt_cache_key": 3}, "prompt_cache_key"),
        ({"messages": [{"role": "user", "content": "Hi", "annotations": []}]}, None),
    ]:
        with pytest.raises(ApiError) as caught:
            chat_request({"messages": [{"role": "user", "content": "Hi"}], **body})
        assert caught.value.param == (param or "messages[0].annotations")
