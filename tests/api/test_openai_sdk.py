"""The `openai` SDK, sync and async with its default retry settings, against the whole service:
context errors in OpenAI's own words, the fields current clients send, and the errors
docs/api.md lists."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from django.conf import settings

from tests.chat.test_openai_api import HI, start_model, tokens

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TOO_LONG = re.compile(
    r"This model's maximum context length is (\d+) tokens\. However, your messages resulted "
    r"in (\d+) tokens\. Please reduce the length of the messages\."
)
NO_ROOM = re.compile(
    r"This model's maximum context length is (\d+) tokens\. However, you requested (\d+) "
    r"tokens \((\d+) in the messages, (\d+) in the completion\)\. Please reduce the length of "
    r"the messages or completion\."
)


def client(base_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, timeout=60)  # retries on


def test_context_errors_are_openais_and_a_caller_who_asks_too_much_is_refused(alpha, key):
    sdk, window = client(alpha, key), settings.MODEL_CONTEXT_TOKENS
    with pytest.raises(openai.BadRequestError) as raised:
        sdk.chat.completions.create(
            model="alpha", messages=[{"role": "user", "content": "x" * (8 * window)}]
        )
    error = raised.value
    assert (error.code, error.param) == ("context_length_exceeded", "messages")
    match = TOO_LONG.fullmatch(error.body["message"])
    assert match and int(match[1]) == window and int(match[2]) > window

    # Messages that fit, and a completion that would not fit beside them: refused as at OpenAI,
    # not quietly shortened.
    half = [{"role": "user", "content": "x" * (2 * window)}]
    with pytest.raises(openai.BadRequestError) as raised:
        sdk.chat.completions.create(model="alpha", messages=half, max_tokens=window)
    error = raised.value
    assert (error.code, error.param) == ("context_length_exceeded", "messages")
    match = NO_ROOM.fullmatch(error.body["message"])
    assert match and int(match[1]) == window
    assert int(match[2]) == int(match[3]) + window and int(match[4]) == window
    # Asking for no particular length is not asking too much: the answer gets the room left.
    assert sdk.chat.completions.create(model="alpha", messages=half).choices[0].message.content


def test_each_model_has_the_window_its_workers_report(alpha, key, start_worker, redis_prefix):
    window = settings.MODEL_CONTEXT_TOKENS  # alpha's worker reports none
    big = 4 * window
    extra = ("--sim-context-tokens", str(big))
    start_model(start_worker, redis_prefix, "wb", "big", tokens=6, extra=extra)
    sdk, messages = client(alpha, key), [{"role": "user", "content": "x" * (8 * window)}]
    with pytest.raises(openai.BadRequestError) as raised:
        sdk.chat.completions.create(model="alpha", messages=messages)
    match = TOO_LONG.fullmatch(raised.value.body["message"])
    assert match and int(match[1]) == window
    # The same messages fit the larger model's window, and it answers them.
    assert sdk.chat.completions.create(model="big", messages=messages).choices[0].message.content
    with pytest.raises(openai.BadRequestError) as raised:
        sdk.chat.completions.create(model="big", messages=messages * 3)
    match = TOO_LONG.fullmatch(raised.value.body["message"])
    assert match and int(match[1]) == big


async def test_the_fields_current_clients_send_are_accepted(alpha, key):
    sdk = openai.AsyncOpenAI(base_url=f"{alpha}/v1", api_key=key, timeout=60)
    first = await sdk.chat.completions.create(model="alpha", messages=HI)
    replayed = [*HI, first.choices[0].message.model_dump(), {"role": "user", "content": "More."}]
    assert "annotations" in replayed[1]  # what the SDK's own message object carries
    again = await sdk.chat.completions.create(
        model="alpha",
        messages=replayed,
        top_logprobs=0,
        extra_body={
            "safety_identifier": "end-user-7",
            "prompt_cache_key": "conversation-3",
            "verbosity": "low",
        },
    )
    assert again.choices[0].message.content == tokens(6)
    for options, param in (
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"extra_body": {"verbosity": "loud"}}, "verbosity"),
        ({"extra_body": {"safety_identifier": 7}}, "safety_identifier"),
    ):
        with pytest.raises(openai.BadRequestError) as raised:
            await sdk.chat.completions.create(model="alpha", messages=HI, **options)
        assert raised.value.param == param
    await sdk.close()


def test_the_errors_docs_list_for_methods_and_sizes(alpha, key):
    auth = {"Authorization": f"Bearer {key}"}
    wrong = httpx.get(f"{alpha}/v1/chat/completions", headers=auth, timeout=30)
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed"
    big = httpx.post(
        f"{alpha}/v1/chat/completions",
        headers={**auth, "Content-Type": "application/json"},
        content=b'{"model": "alpha", "messages": [{"role": "user", "content": "'
        + b"x" * 2_700_000
        + b'"}]}',
        timeout=30,
    )
    assert big.status_code == 413
    assert set(big.json()["error"]) == {"message", "type", "param", "code"}
