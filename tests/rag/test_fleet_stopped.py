"""Retrieval on the fleet with no embedding worker running (RAG_EMBEDDING_UNAVAILABLE=answer):
the question still goes on, and the person is told it is answered without their documents'
passages, on the chat page's websocket and in the REST API; a person with no documents to
search is told nothing."""

from __future__ import annotations

import json
import uuid

import pytest
from asgiref.sync import sync_to_async

from apps.chat.services import conversation_create
from apps.rag.services import RETRIEVAL_UNAVAILABLE_NOTICE
from tests.chat.conftest import chat_socket, close_thread_connections, receive_until
from tests.chat.test_api import api_client
from tests.conftest import read_sse

__all__ = ["close_thread_connections"]  # a fixture the websocket tests use

# Never asked before in this process: a question embedded already would be answered from the
# web process's own query cache, with passages, fleet or no fleet.
QUESTION = f"How many days of paid vacation do I get? (ticket {uuid.uuid4().hex[:8]})"


@pytest.fixture
def fleet_stopped(settings, monkeypatch):
    """MiniLM served by `python -m worker embed`, of which none runs; set for this process and
    for the web processes the test starts (they read it from their environment)."""
    settings.RAG_EMBEDDING_SERVING = "fleet"
    settings.RAG_EMBEDDING_UNAVAILABLE = "answer"
    monkeypatch.setenv("RAG_EMBEDDING_SERVING", "fleet")
    monkeypatch.setenv("RAG_EMBEDDING_UNAVAILABLE", "answer")


async def _first_status(user) -> tuple[dict, dict]:
    """The question sent on the chat page's websocket: the question as shown, and the first
    status of its answer."""
    conversation = await sync_to_async(conversation_create)(owner=user)
    async with chat_socket(user, conversation.id) as (ws, ok, _):
        assert ok
        await ws.send_to(text_data=json.dumps({"type": "send", "text": QUESTION}))
        frames = await receive_until(ws, "status", timeout=60)
    shown = [f for f in frames if f["type"] == "user_message"]
    assert shown and not [f for f in frames if f["type"] == "error"], frames
    return shown[0], frames[-1]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_thread_connections")
async def test_the_page_says_the_answer_goes_on_without_passages(handbook, user, fleet_stopped):
    shown, status = await _first_status(user)
    assert shown["html"]  # the question was sent, not refused
    assert status["state"] == "queued"
    assert status["notice"] == RETRIEVAL_UNAVAILABLE_NOTICE
    assert not status.get("citations")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_thread_connections")
async def test_a_person_without_documents_is_told_nothing(user, fleet_stopped):
    _, status = await _first_status(user)
    assert "notice" not in status


@pytest.mark.django_db(transaction=True)
def test_the_rest_api_says_so_in_its_response_and_events(handbook, fleet_stopped, live_web, user):
    with api_client(live_web, user) as api:
        response = api.post("/api/v1/requests", json={"text": QUESTION})
        assert response.status_code == 202, response.text
        accepted = response.json()
        assert accepted["notice"] == RETRIEVAL_UNAVAILABLE_NOTICE
        detail = api.get(f"/api/v1/requests/{accepted['request_id']}").json()
        assert detail["notice"] == RETRIEVAL_UNAVAILABLE_NOTICE
        with api.stream("GET", accepted["events_url"]) as events:
            first = read_sse(events, stop_after=1)[0]
    assert first["event"] == "status"
    assert first["data"]["notice"] == RETRIEVAL_UNAVAILABLE_NOTICE
