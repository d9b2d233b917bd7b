"""Questions sent to the REST API (`POST /api/v1/requests`) with an API key are counted under
that key, as the OpenAI API's are: `GET /api/v1/usage` with the key shows them."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.accounts.services import api_key_create
from apps.usage.models import RequestUsage
from contract.protocol import Answer, State, Usage
from tests.usage.test_feedback_and_pages import bearer
from tests.usage.test_recording import deliver

pytestmark = pytest.mark.django_db


def answered(user, submitted: dict, *, prompt_tokens: int, completion_tokens: int) -> None:
    """The worker's answer to a submitted request, as the recorder receives it."""
    deliver(
        Answer(
            id=submitted["request_id"],
            user_id=str(user.pk),
            conversation_id=str(submitted["conversation"]),
            state=State.DONE,
            text="Rayleigh scattering.",
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens),
            model="smollm2",
        )
    )


def test_a_rest_request_sent_with_a_key_is_counted_under_that_key(user, client_for):
    key, raw = api_key_create(user=user, name="script")
    _, other_raw = api_key_create(user=user, name="notebook")
    response = Client().post(
        "/api/v1/requests",
        {"text": "Why is the sky blue?"},
        content_type="application/json",
        **bearer(raw),
    )
    assert response.status_code == 202, response.content
    answered(user, response.json(), prompt_tokens=30, completion_tokens=4)
    # The same user from the page's session: theirs, but sent with no key.
    by_session = client_for(user).post(
        "/api/v1/requests", {"text": "And at sunset?"}, content_type="application/json"
    )
    assert by_session.status_code == 202, by_session.content
    answered(user, by_session.json(), prompt_tokens=50, completion_tokens=6)

    usage = Client().get("/api/v1/usage?granularity=hour&days=1", **bearer(raw)).json()
    assert usage["key"]["id"] == key.id
    assert [(r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in usage["data"]] == [
        (1, 30, 4)
    ]
    # Another key of the same user sent nothing, though the plan counts all of it.
    other = Client().get("/api/v1/usage?granularity=hour&days=1", **bearer(other_raw)).json()
    assert other["data"] == [] and other["plan"]["tokens_last_24h"] == 90
    assert RequestUsage.objects.get(request_id=by_session.json()["request_id"]).api_key_id == 0
