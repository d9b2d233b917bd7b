"""The API for scripts: 202 Accepted, Server-Sent Events with Last-Event-ID, and who may see what.
Driven over real HTTP against a real daphne process, a real worker and the real model."""

from __future__ import annotations

import httpx
import pytest

from apps.accounts.services import api_key_create
from apps.chat.models import Conversation
from apps.chat.services import conversation_create
from tests.chat.conftest import answer_text
from tests.conftest import read_sse

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def answer_length(settings):
    """Set before the web process starts, which reads it from its environment."""
    settings.MODEL_MAX_TOKENS = 60
    settings.MODEL_TEMPERATURE = 0.0


def text_of(events: list[dict]) -> str:
    return answer_text([event["data"] for event in events])


def api_client(base_url: str, user) -> httpx.Client:
    """An HTTP client that authenticates as `user` with a fresh API key."""
    _, raw = api_key_create(user=user, name="tests")
    return httpx.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {raw}"}, timeout=httpx.Timeout(180)
    )


@pytest.fixture
def api(live_web, user):
    with api_client(live_web, user) as client:
        yield client


@pytest.fixture
def other_api(live_web, other_user):
    with api_client(live_web, other_user) as client:
        yield client


@pytest.mark.slow
def test_submit_then_stream_and_resume_with_last_event_id(api, start_worker, dispatcher):
    start_worker("w1")
    response = api.post("/api/v1/requests", json={"text": "Tell me a story about a river."})
    assert response.status_code == 202
    body = response.json()
    assert body["state"] == "queued"
    events_url = body["events_url"]
    assert response.headers["Location"] == events_url

    with api.stream("GET", events_url) as uninterrupted, api.stream("GET", events_url) as first:
        head = read_sse(first, stop_after=4)
        full = read_sse(uninterrupted)
    last_seen = head[-1]["id"]
    with api.stream("GET", events_url, headers={"Last-Event-ID": last_seen}) as resumed:
        tail = read_sse(resumed)

    assert full[-1]["event"] == "final" and full[-1]["data"]["state"] == "done"
    assert all(e["id"] > last_seen for e in tail)
    assert text_of(head + tail) == text_of(full) == full[-1]["data"]["text"]
    assert api.get(f"/api/v1/requests/{body['request_id']}").json()["state"] == "done"


def test_another_user_cannot_read_resume_or_stop_my_request(api, other_api, user):
    response = api.post("/api/v1/requests", json={"text": "private question"})
    request_id = response.json()["request_id"]
    assert other_api.get(f"/api/v1/requests/{request_id}").status_code == 404
    assert other_api.get(f"/api/v1/requests/{request_id}/events").status_code == 404
    resumed = other_api.get(
        f"/api/v1/requests/{request_id}/events", headers={"Last-Event-ID": "0-0"}
    )
    assert resumed.status_code == 404
    assert other_api.post(f"/api/v1/requests/{request_id}/cancel").status_code == 404
    conversation = response.json()["conversation"]
    foreign = other_api.post("/api/v1/requests", json={"text": "hi", "conversation": conversation})
    assert foreign.status_code == 404
    # My own request is untouched and still mine.
    assert api.get(f"/api/v1/requests/{request_id}").json()["state"] == "queued"


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"not json", 400, "JSON object"),
        (b"[1, 2]", 400, "JSON object"),
        (b'{"text": "hi \\ud800"}', 400, "surrogate"),
        (b'{"text": NaN}', 400, "JSON object"),
        (b"{}", 400, "'text'"),
        (b'{"text": "   "}', 400, "Type a message first."),
        (b'{"text": "' + b"x" * 8001 + b'"}', 400, "the limit is 8,000"),
        (b'{"text": "hi", "conversation": "7"}', 400, "integer"),
        (b'{"text": "hi", "conversation": 999999}', 404, None),
    ],
)
def test_bad_requests_get_clear_errors_and_store_nothing(api, body, status, message):
    response = api.post(
        "/api/v1/requests", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == status
    if message:
        assert message in response.json()["error"]
    assert not Conversation.objects.filter(messages__isnull=False).exists()


def test_requests_need_authentication(live_web):
    assert httpx.post(f"{live_web}/api/v1/requests", json={"text": "hi"}).status_code == 401
    bad_key = {"Authorization": "Bearer sk-sluice-not-a-real-key"}
    response = httpx.post(f"{live_web}/api/v1/requests", json={"text": "hi"}, headers=bad_key)
    assert response.status_code == 401


def test_a_malformed_last_event_id_is_a_clear_400(api):
    request_id = api.post("/api/v1/requests", json={"text": "hello"}).json()["request_id"]
    response = api.get(
        f"/api/v1/requests/{request_id}/events", headers={"Last-Event-ID": "garbage"}
    )
    assert response.status_code == 400
    assert "Last-Event-ID" in response.json()["error"]


def test_revoked_keys_stop_working(live_web, user):
    key, raw = api_key_create(user=user, name="temp")
    headers = {"Authorization": f"Bearer {raw}"}
    conversation = conversation_create(owner=user)
    ok = httpx.post(
        f"{live_web}/api/v1/requests",
        headers=headers,
        json={"text": "hi", "conversation": conversation.id},
    )
    assert ok.status_code == 202
    key.revoked = True
    key.save()
    denied = httpx.post(f"{live_web}/api/v1/requests", headers=headers, json={"text": "hi"})
    assert denied.status_code == 401
