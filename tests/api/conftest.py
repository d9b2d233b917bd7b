"""What the client-library conformance tests share: a roomy plan, a key, and one simulated
worker serving "alpha" behind the whole service (daphne, the dispatcher, a worker process)."""

from __future__ import annotations

import os

import pytest

from apps.accounts.services import api_key_create
from tests.admission.conftest import force_level
from tests.chat.test_openai_api import roomy, start_model

# LiteLLM fetches its model price list from the internet when it is imported, unless told to
# use the copy it ships: offline, each import would wait for that fetch to time out.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture
def plan(transactional_db):
    force_level(0)  # this machine's own load must not cap or shed the tests' answers
    return roomy()


@pytest.fixture
def key(plan, user) -> str:
    return api_key_create(user=user, name="conformance")[1]


@pytest.fixture
def alpha(live_web, dispatcher, start_worker, redis_prefix, plan):
    """One worker serving "alpha" (6-token answers) behind the whole service."""
    start_model(start_worker, redis_prefix, "wa", "alpha", tokens=6)
    return live_web
