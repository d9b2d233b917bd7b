"""LiteLLM against Sluice's /v1 as an `openai/` provider: answers, streams, and Sluice's errors
raised as the exception classes LiteLLM's routers and fallbacks act on."""

from __future__ import annotations

import litellm
import pytest
from django.conf import settings

from tests.admission.conftest import force_level
from tests.chat.test_openai_api import HI, roomy, tokens

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def plan(transactional_db):
    force_level(0)
    # Two requests at once, then a refusal: the next is a minute away, past the queue limit.
    return roomy(burst_requests=2, requests_per_minute=1, max_queue_wait_seconds=30)


def ask(base_url: str, key: str, **options):
    # No retries: a 429 says to retry in a minute, which the openai client underneath would do.
    options = {"model": "openai/alpha", "messages": HI, "max_retries": 0, **options}
    return litellm.completion(api_base=f"{base_url}/v1", api_key=key, **options)


def test_litellm_gets_answers_and_raises_its_own_exception_classes(alpha, key):
    whole = ask(alpha, key)
    assert whole.choices[0].message.content == tokens(6)
    streamed = ask(alpha, key, stream=True, max_tokens=4)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == tokens(4)

    window = settings.MODEL_CONTEXT_TOKENS
    with pytest.raises(litellm.ContextWindowExceededError):
        ask(alpha, key, messages=[{"role": "user", "content": "x" * (8 * window)}])
    with pytest.raises(litellm.AuthenticationError):
        ask(alpha, "sk-sluice-not-a-key")
    with pytest.raises(litellm.NotFoundError):
        ask(alpha, key, model="openai/gpt-9")
    with pytest.raises(litellm.BadRequestError) as raised:
        ask(alpha, key, seed=7)
    assert not isinstance(raised.value, litellm.ContextWindowExceededError)
    with pytest.raises(litellm.RateLimitError):  # the plan's two requests are spent
        ask(alpha, key)
