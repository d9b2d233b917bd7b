"""How a streamed answer's events become chunks when the request asks for log probabilities
or for several choices: each chunk's text with its tokens' entries, each choice under its own
index with its own end, and one end of the stream for them all; a plain request's chunks are
the ones it always had."""

from __future__ import annotations

import json

from apps.api.openai_choices import usage_sum
from apps.api.openai_errors import ApiError
from apps.api.openai_relay import StreamRelay
from apps.api.openai_shapes import Chunks
from contract.protocol import EventType


def scored(token: str) -> dict:
    return {"token": token, "logprob": -0.25, "bytes": list(token.encode()), "top_logprobs": []}


def delta(text: str, *tokens: str) -> tuple[str, dict]:
    fields = {"type": EventType.DELTA, "text": text}
    if tokens:
        fields["logprobs"] = json.dumps([scored(token) for token in tokens])
    return "1-0", fields


START = ("1-0", {"type": EventType.START, "attempt": "1"})


def final(text: str, completion_tokens: int) -> tuple[str, dict]:
    usage = {"prompt_tokens": 5, "completion_tokens": completion_tokens}
    fields = {"type": EventType.FINAL, "state": "done", "text": text, "finish_reason": "length"}
    return "1-0", {**fields, "usage": json.dumps(usage)}


def data(out: str) -> list[dict | str]:
    lines = [line[6:] for line in out.split("\n\n") if line.startswith("data: ")]
    return [line if line == "[DONE]" else json.loads(line) for line in lines]


def relay(**options) -> StreamRelay:
    chunks = Chunks(request_id="r", model="m", created=1, include_usage=True)
    return StreamRelay(chunks, error_of=lambda f: ApiError(500, "failed"), **options)


def test_each_chunk_carries_its_own_texts_log_probabilities():
    one = relay()
    out = data(
        one.feed([START, delta("Hel", "Hel"), delta("lo", "lo"), delta("", "!")])
        + one.feed([delta(" there", " there"), final("Hello there", 4)])
    )
    texts = [c["choices"][0] for c in out[:-1] if c["choices"] and c["choices"][0]["delta"]]
    content = [c for c in texts if "content" in c["delta"] and c["delta"]["content"] != ""]
    # The deltas of one batch are one chunk, with every entry of its tokens, in order.
    assert [c["delta"]["content"] for c in content] == ["Hello", " there"]
    assert [[e["token"] for e in c["logprobs"]["content"]] for c in content] == [
        ["Hel", "lo", "!"],
        [" there"],
    ]
    assert out[-1] == "[DONE]" and out[-2]["usage"]["completion_tokens"] == 4


def test_a_plain_request_streams_the_chunks_it_always_did():
    plain = relay()
    out = data(plain.feed([START, delta("Hi"), final("Hi", 1)]))
    assert [c["choices"][0]["logprobs"] for c in out[:3]] == [None, None, None]
    assert out[1]["choices"][0]["delta"] == {"content": "Hi"}
    assert out[2]["choices"][0]["finish_reason"] == "length"
    assert out[-1] == "[DONE]" and len(out) == 5  # role, text, finish, usage, [DONE]


def test_a_choice_of_several_ends_itself_but_not_the_stream():
    second = relay(index=1, closes=False)
    out = data(second.feed([START, delta("Hi"), final("Hi", 3)]))
    assert {c["choices"][0]["index"] for c in out} == {1}
    assert out[-1]["choices"][0]["finish_reason"] == "length"
    assert "[DONE]" not in out and not any(c.get("usage") for c in out)
    assert second.ended and not second.failed and second.usage["completion_tokens"] == 3
    assert usage_sum([second.usage, {"prompt_tokens": 5, "completion_tokens": 2}]) == {
        "prompt_tokens": 10,
        "completion_tokens": 5,
    }
