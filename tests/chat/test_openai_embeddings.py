"""`POST /v1/embeddings` with the `openai` package against a live daphne: the embedding model
Sluice ships, in OpenAI's shape (the package asks for base64 by default, floats on request),
its errors, and the plan's models and rates applied to it."""

from __future__ import annotations

import math

import openai
import pytest

from apps.accounts.services import api_key_create
from apps.admission.models import Plan
from tests.chat.test_openai_api import client_for, roomy

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MODEL = "all-MiniLM-L6-v2"


def test_embeddings_come_back_in_openais_shape(live_web, user):
    roomy()
    client = client_for(live_web, api_key_create(user=user, name="e")[1])
    texts = ["Rivers run to the sea.", "Tax law is complicated.", "Rivers run to the sea."]
    packed = client.embeddings.create(model=MODEL, input=texts)  # base64 on the wire
    assert packed.model == MODEL and packed.object == "list"
    assert [d.index for d in packed.data] == [0, 1, 2]
    vectors = [d.embedding for d in packed.data]
    assert {len(v) for v in vectors} == {384}
    assert all(abs(math.hypot(*v) - 1) < 1e-3 for v in vectors)  # unit length
    assert vectors[0] == vectors[2] and vectors[0] != vectors[1]
    assert packed.usage.prompt_tokens == packed.usage.total_tokens > len(texts)

    floats = client.embeddings.create(model=MODEL, input=texts[0], encoding_format="float")
    assert len(floats.data) == 1
    pairs = zip(floats.data[0].embedding, vectors[0], strict=True)
    assert max(abs(a - b) for a, b in pairs) < 1e-6

    with pytest.raises(openai.NotFoundError) as raised:
        client.embeddings.create(model="text-embedding-3-small", input="x")
    assert raised.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model=MODEL, input=[[101, 2054, 102]])
    assert raised.value.param == "input"
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model=MODEL, input="x", dimensions=128)
    assert raised.value.param == "dimensions"


def test_the_plan_decides_who_may_embed_and_how_often(live_web, user):
    roomy(model_names=["alpha"])
    client = client_for(live_web, api_key_create(user=user, name="e")[1])
    with pytest.raises(openai.NotFoundError):  # the plan does not list the embedding model
        client.embeddings.create(model=MODEL, input="x")
    Plan.objects.filter(slug="free").update(
        model_names=["alpha", MODEL], burst_requests=1, requests_per_minute=1
    )
    assert client.embeddings.create(model=MODEL, input="first").data
    with pytest.raises(openai.RateLimitError) as raised:
        client.embeddings.create(model=MODEL, input="second")
    headers = raised.value.response.headers
    assert int(headers["Retry-After"]) >= 1
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-limit-requests"] == "1"
