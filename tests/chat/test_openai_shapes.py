"""OpenAI's answer shapes: what a client's SDK parses."""

from __future__ import annotations

import json

import pytest

from apps.api.openai_errors import ApiError, body_of
from apps.api.openai_shapes import Chunks, completion


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
