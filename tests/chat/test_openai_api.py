"""The OpenAI-compatible API driven by the official `openai` package (sync and async, streamed
and not) against a real daphne, the real dispatcher and real workers (the simulated engine:
its answers are "tok0 tok1 ...", so a test can tell exactly what came back)."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest

from apps.accounts.services import api_key_create
from apps.admission.models import Plan
from apps.chat.models import Message
from contract.protocol import Keys
from core.redis_client import get_redis
from tests.admission.conftest import force_level
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST = ("--sim-first-token-ms", "5", "--sim-decode-ms", "5")
HI = [{"role": "user", "content": "Say hi."}]


def roomy(**limits) -> Plan:
    """The default plan, with room for every test request unless a test says otherwise."""
    values = dict(
        name="Free",
        is_default=True,
        requests_per_minute=10_000,
        burst_requests=10_000,
        tokens_per_minute=10**8,
        burst_tokens=10**7,
        tokens_per_day=10**8,
        max_concurrent=50,
        max_queue_wait_seconds=120,
        model_names=[],
    )
    values.update(limits)
    plan, _ = Plan.objects.update_or_create(slug="free", defaults=values)
    Plan.objects.exclude(pk=plan.pk).update(is_default=False)
    return plan


@pytest.fixture
def plan(transactional_db):
    force_level(0)  # this machine's own load must not cap or shed the tests' answers
    return roomy()


@pytest.fixture
def key(plan, user) -> str:
    return api_key_create(user=user, name="openai tests")[1]


def client_for(base_url: str, key: str, **options) -> openai.OpenAI:
    options = {"max_retries": 0, "timeout": 60, **options}
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, **options)


def start_model(
    start_worker, redis_prefix, worker_id: str, model: str, *, tokens: int, slots: int = 4, extra=()
):
    """A simulated worker serving `model`, beating before this returns."""
    process = start_worker(
        worker_id,
        engine="simulated",
        slots=slots,
        extra=("--served-model-name", model, "--sim-tokens", str(tokens), *FAST, *extra),
    )
    keys = Keys(prefix=redis_prefix)
    wait_until(lambda: get_redis().exists(keys.heartbeat(worker_id)), what=f"{worker_id} to beat")
    return process


def tokens(count: int, start: int = 0) -> str:
    return "".join(f"tok{i} " for i in range(start, count))


def request_fields(redis_prefix: str, request_id: str) -> dict:
    return get_redis().hgetall(Keys(prefix=redis_prefix).request(request_id))


def final_event(redis_prefix: str, request_id: str) -> dict | None:
    entries = get_redis().xrevrange(Keys(prefix=redis_prefix).output(request_id), count=3)
    return next((f for _, f in entries if f.get("type") == "final"), None)


@pytest.fixture
def alpha(live_web, dispatcher, start_worker, redis_prefix, plan):
    """One worker serving "alpha" (6-token answers) behind the whole service."""
    start_model(start_worker, redis_prefix, "wa", "alpha", tokens=6)
    return live_web


def test_the_sync_client_gets_whole_and_streamed_completions(alpha, key):
    client = client_for(alpha, key)
    whole = client.chat.completions.create(model="alpha", messages=HI)
    assert whole.object == "chat.completion" and whole.model == "alpha"
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].message.content == tokens(6)
    assert whole.choices[0].finish_reason == "stop"
    assert whole.usage.completion_tokens == 6
    assert whole.usage.prompt_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 6

    capped = client.chat.completions.create(model="alpha", messages=HI, max_tokens=3)
    assert capped.choices[0].message.content == tokens(3)
    assert capped.choices[0].finish_reason == "length"

    stream = client.chat.completions.create(
        model="alpha",
        messages=HI,
        stream=True,
        stream_options={"include_usage": True},
        max_completion_tokens=4,
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == tokens(4)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    # Stateless, as at OpenAI: nothing was stored as a conversation.
    assert not Message.objects.exists()


async def test_the_async_client_streams_and_stops_at_a_stop_sequence(alpha, key):
    client = openai.AsyncOpenAI(base_url=f"{alpha}/v1", api_key=key, max_retries=0, timeout=60)
    stream = await client.chat.completions.create(
        model="alpha",
        messages=HI,
        stream=True,
        stop=["tok3"],
        temperature=0.2,
        top_p=0.9,
        user="end-user-7",
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == tokens(3)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks)  # no usage chunk unless asked for
    whole = await client.chat.completions.create(
        model="alpha",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Say hi."}]},
            {"role": "assistant", "content": "Hi."},
            {"role": "user", "content": "Again."},
        ],
    )
    assert whole.choices[0].message.content == tokens(6)
    await client.close()


# A 1x1 PNG: an image the web reads, which the simulated engine cannot.
PIXEL = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"n": 2}, "n"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"logprobs": True}, "logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"seed": 7}, "seed"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is this?"},
                            {
                                "type": "image_url",
                                "image_url": {"url": PIXEL},
                            },
                        ],
                    }
                ]
            },
            "messages[0].content[1].image_url",
        ),
        (
            {"messages": [{"role": "tool", "content": "42", "tool_call_id": "x"}]},
            "messages[0].role",
        ),
        ({"extra_body": {"best_of": 3}}, "best_of"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 3}, "temperature"),
    ],
)
def test_what_sluice_does_not_support_is_a_400_naming_the_parameter(alpha, key, options, param):
    request = {"model": "alpha", "messages": HI, **options}
    with pytest.raises(openai.BadRequestError) as raised:
        client_for(alpha, key).chat.completions.create(**request)
    assert raised.value.status_code == 400
    assert raised.value.param == param
    assert raised.value.type == "invalid_request_error"
    assert raised.value.message


def test_a_bad_key_is_a_401_in_openais_shape(live_web, plan):
    with pytest.raises(openai.AuthenticationError) as raised:
        client_for(live_web, "sk-sluice-not-a-key").chat.completions.create(
            model="alpha", messages=HI
        )
    assert raised.value.status_code == 401 and raised.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        client_for(live_web, "sk-sluice-not-a-key").models.list()
    response = httpx.get(f"{live_web}/v1/models")  # no key at all
    assert response.status_code == 401
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_unknown_and_unplanned_models_are_404_and_a_model_without_a_worker_503(
    live_web, dispatcher, start_worker, redis_prefix, key
):
    worker = start_model(start_worker, redis_prefix, "wa", "alpha", tokens=6)
    start_model(start_worker, redis_prefix, "wb", "beta", tokens=9)
    client = client_for(live_web, key)
    assert client.chat.completions.create(model="beta", messages=HI).choices[
        0
    ].message.content == tokens(9)
    with pytest.raises(openai.NotFoundError) as raised:
        client.chat.completions.create(model="gpt-9", messages=HI)
    assert raised.value.code == "model_not_found" and raised.value.param == "model"

    Plan.objects.filter(slug="free").update(model_names=["alpha"])
    with pytest.raises(openai.NotFoundError) as raised:  # the plan's limit is not told apart
        client.chat.completions.create(model="beta", messages=HI)
    assert raised.value.code == "model_not_found"
    assert [m.id for m in client.models.list()] == ["alpha"]

    worker.terminate()  # alpha's only worker goes away
    worker.wait(timeout=30)
    wait_until(lambda: not list(client.models.list()), what="alpha to leave the list")
    with pytest.raises(openai.InternalServerError) as raised:
        client.chat.completions.create(model="alpha", messages=HI)
    assert raised.value.status_code == 503
    assert raised.value.code == "model_unavailable"
    assert raised.value.response.headers["Retry-After"]


def test_models_list_names_the_live_models_and_retrieves_one(
    live_web, dispatcher, start_worker, redis_prefix, key
):
    start_model(start_worker, redis_prefix, "wa", "alpha", tokens=6)
    start_model(start_worker, redis_prefix, "wb", "beta", tokens=9)
    client = client_for(live_web, key)
    models = list(client.models.list())
    assert sorted(m.id for m in models) == ["alpha", "beta"]
    assert {m.object for m in models} == {"model"} and {m.owned_by for m in models} == {"sluice"}
    assert client.models.retrieve("beta").id == "beta"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gamma")
    # Each model's requests go to its own workers.
    assert client.chat.completions.create(model="alpha", messages=HI).usage.completion_tokens == 6
    assert client.chat.completions.create(model="beta", messages=HI).usage.completion_tokens == 9


@pytest.fixture
def tight_plan(transactional_db):
    force_level(0)
    # One request a minute: the second waits far longer than it may, and is refused at once.
    # The first has room to reach a worker that has only just started, on a loaded machine.
    return roomy(burst_requests=1, requests_per_minute=1, max_queue_wait_seconds=10)


def test_a_rate_limited_request_is_a_429_with_the_plans_limits(
    tight_plan, user, live_web, dispatcher, start_worker, redis_prefix
):
    start_model(start_worker, redis_prefix, "wa", "alpha", tokens=6)
    client = client_for(live_web, api_key_create(user=user, name="t")[1])
    assert client.chat.completions.create(model="alpha", messages=HI).choices
    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(model="alpha", messages=HI)
    error = raised.value
    assert error.status_code == 429 and error.code == "rate_limit_exceeded"
    headers = error.response.headers
    assert int(headers["Retry-After"]) >= 1
    assert headers["x-ratelimit-limit-requests"] == "1"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-limit-tokens"] == str(tight_plan.tokens_per_minute)
    assert int(headers["x-ratelimit-remaining-tokens"]) > 0
    assert headers["x-ratelimit-reset-requests"].endswith("s")
    assert "x-ratelimit-reset-tokens" in headers
    # The streamed form of the same refusal is a 429 too: it comes before any body.
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="alpha", messages=HI, stream=True)


def sse_lines(response: httpx.Response):
    for line in response.iter_lines():
        if line:
            yield line


def test_a_streamed_request_waiting_in_line_hears_its_position_as_comments(alpha_single_slot, key):
    base, _ = alpha_single_slot
    client = client_for(base, key)
    hog = client.chat.completions.create(model="alpha", messages=HI, stream=True, max_tokens=400)
    next(iter(hog))  # the only slot is busy now
    with (
        httpx.Client(timeout=60) as http,
        http.stream(
            "POST",
            f"{base}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": "alpha", "messages": HI, "stream": True, "max_tokens": 5},
        ) as waiting,
    ):
        assert waiting.status_code == 200
        assert waiting.headers["content-type"].startswith("text/event-stream")
        lines = []
        for line in sse_lines(waiting):
            lines.append(line)
            if line == "data: [DONE]":
                break
    comments = [line for line in lines if line.startswith(":")]
    assert comments and comments[0].startswith(": queued, position 1, about ")
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data:"))
    assert lines.index(comments[0]) < first_data
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == tokens(5)
    hog.close()


@pytest.fixture
def alpha_single_slot(live_web, dispatcher, start_worker, redis_prefix, plan):
    """One worker serving "alpha" with one slot and long answers (about 10 ms a token)."""
    start_model(
        start_worker,
        redis_prefix,
        "wa",
        "alpha",
        tokens=3000,
        slots=1,
        extra=("--sim-decode-ms", "10"),
    )
    return live_web, redis_prefix


def wait_for_stopped_engine(redis_prefix: str, request_id: str) -> dict:
    keys = Keys(prefix=redis_prefix)
    final = wait_until(
        lambda: final_event(redis_prefix, request_id), timeout=60, what="the request to end"
    )
    wait_until(
        lambda: json.loads(get_redis().get(keys.heartbeat("wa")) or "{}").get("busy") == 0,
        what="the worker's slot to be free",
    )
    return final


def test_a_client_that_disconnects_mid_stream_stops_the_answer(alpha_single_slot, key):
    base, redis_prefix = alpha_single_slot
    with (
        httpx.Client(timeout=60) as http,
        http.stream(
            "POST",
            f"{base}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": "alpha", "messages": HI, "stream": True, "max_tokens": 1900},
        ) as response,
    ):
        request_id = response.headers["x-request-id"]
        texts = 0
        for line in sse_lines(response):
            texts += '"content":"tok' in line
            if texts >= 3:
                break  # and leave: the connection closes
    final = wait_for_stopped_engine(redis_prefix, request_id)
    assert final["state"] == "cancelled"
    assert json.loads(final["usage"])["completion_tokens"] < 1000  # of 3000: the engine stopped
    assert request_fields(redis_prefix, request_id)["state"] == "cancelled"


def test_a_client_that_gives_up_on_a_whole_completion_stops_it(alpha_single_slot, key):
    base, redis_prefix = alpha_single_slot
    with pytest.raises(openai.APITimeoutError):
        client_for(base, key, timeout=1.5).chat.completions.create(
            model="alpha", messages=HI, max_tokens=1900
        )
    keys = Keys(prefix=redis_prefix)
    [request_key] = wait_until(
        lambda: list(get_redis().scan_iter(match=keys.request("*"))), what="the request"
    )
    request_id = request_key.split("{")[1].rstrip("}")
    final = wait_for_stopped_engine(redis_prefix, request_id)
    assert final["state"] == "cancelled"
    assert json.loads(final["usage"])["completion_tokens"] < 1000


def test_a_cancelled_call_stays_cancelled_with_the_sdks_default_retries(alpha_single_slot, key):
    """The `openai` SDK retries a 409 by default; Sluice's says not to, so a call cancelled
    through the REST API is not submitted again, and the error names its request."""
    base, redis_prefix = alpha_single_slot
    keys = Keys(prefix=redis_prefix)
    errors: list[Exception] = []

    def call() -> None:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, timeout=60)  # retries on
        try:
            client.chat.completions.create(model="alpha", messages=HI, max_tokens=1900)
        except Exception as exc:
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    [request_key] = wait_until(
        lambda: list(get_redis().scan_iter(match=keys.request("*"))), what="the request"
    )
    request_id = request_key.split("{")[1].rstrip("}")
    cancelled = httpx.post(
        f"{base}/api/v1/requests/{request_id}/cancel",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert cancelled.status_code == 202, cancelled.text
    caller.join(timeout=60)
    [error] = errors
    assert isinstance(error, openai.ConflictError)
    assert error.response.headers["x-should-retry"] == "false"
    assert error.request_id == request_id
    assert error.body["code"] == "request_cancelled"
    assert len(list(get_redis().scan_iter(match=keys.request("*")))) == 1  # never sent again


def test_a_body_that_is_not_json_is_a_400_with_no_param(live_web, plan, key):
    response = httpx.post(
        f"{live_web}/v1/chat/completions",
        content=b"{not json",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] is None  # OpenAI's null, not ""
