"""Feedback on answers (the API and the page's form), a person's own usage (the API and the
profile), the admin's usage and feedback pages with their CSV, and retention."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from apps.accounts.services import api_key_create, api_key_hash
from apps.chat import recorder
from apps.chat.data.export import user_export_all
from apps.chat.data.retention import conversation_erase
from apps.chat.services import conversation_create
from apps.rag.embeddings import DIMENSIONS
from apps.rag.models import Chunk, Corpus, Document
from apps.usage.models import Feedback, HourlyUsage, RequestUsage
from apps.usage.services import usage_retention_apply
from contract.protocol import Answer, State, Usage
from core.redis_client import get_redis, keys

pytestmark = pytest.mark.django_db


def recorded(user, request_id: str, *, conversation=None, api_key: str = "", **extra) -> None:
    """An answer of `user`'s as the recorder stores it (with its usage)."""
    fields = {"kind": "rag" if extra.get("citations") else "chat"}
    if api_key:
        fields["api_key"] = api_key_hash(api_key)
    if extra.get("citations"):
        fields["citations"] = json.dumps(extra.pop("citations"))
    get_redis().hset(keys().request(request_id), mapping=fields)
    answer = Answer(
        id=request_id,
        user_id=str(user.pk),
        conversation_id=str(conversation.id) if conversation else "",
        state=State.DONE,
        text=extra.get("text", "Blue [1]."),
        usage=Usage(prompt_tokens=100, completion_tokens=20, cached_tokens=60),
        model="smollm2",
    )
    recorder.ensure_group()
    get_redis().xadd(keys().done, answer.to_fields())
    recorder.record_pending(consumer="c1", block_ms=10)


def cited_chunk() -> Chunk:
    corpus = Corpus.objects.create(name="handbook")
    document = Document.objects.create(
        corpus=corpus,
        title="Sky",
        source="sky.md",
        kind="md",
        content="The sky is blue.",
        checksum="1" * 64,
        pipeline="test",
    )
    return Chunk.objects.create(
        corpus=corpus,
        document=document,
        ordinal=0,
        text="The sky is blue.",
        token_count=4,
        char_start=0,
        char_end=16,
        embedding=[1.0] + [0.0] * (DIMENSIONS - 1),
    )


def bearer(raw: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def test_a_vote_is_stored_with_what_produced_the_answer_and_can_change(user):
    chunk = cited_chunk()
    conversation = conversation_create(owner=user)
    citation = {"number": 1, "chunk_id": chunk.id, "document_id": chunk.document_id}
    recorded(user, "r1", conversation=conversation, citations=[citation])
    _, raw = api_key_create(user=user, name="k")
    url = "/api/v1/requests/r1/feedback"
    response = Client().post(
        url,
        {"vote": "down", "reasons": ["wrong", "bad_sources"], "comment": " Not blue. "},
        content_type="application/json",
        **bearer(raw),
    )
    assert response.status_code == 200, response.content
    assert response.json() == {
        "request_id": "r1",
        "vote": "down",
        "reasons": ["bad_sources", "wrong"],
        "comment": "Not blue.",
    }
    feedback = Feedback.objects.get()
    assert (feedback.model, feedback.kind, feedback.prompt_tokens) == ("smollm2", "rag", 100)
    assert (feedback.passages, feedback.corpora) == ([chunk.id], [chunk.corpus_id])
    assert feedback.conversation_id == conversation.id
    # One click changes it: the reasons belong to a down-vote only.
    Client().post(url, {"vote": "up"}, content_type="application/json", **bearer(raw))
    feedback.refresh_from_db()
    assert (feedback.vote, feedback.reasons) == (Feedback.UP, [])
    Client().post(url, {"vote": None}, content_type="application/json", **bearer(raw))
    assert not Feedback.objects.exists()


def test_bad_feedback_is_told_what_is_wrong(user):
    recorded(user, "r1")
    _, raw = api_key_create(user=user, name="k")
    url = "/api/v1/requests/r1/feedback"
    for body, says in (
        ({"vote": "meh"}, "'vote' must be"),
        ({"vote": "down", "reasons": ["ugly"]}, "'reasons' must be a list of"),
        ({"vote": "down", "comment": "x" * 2001}, "at most 2000"),
        ({}, "'vote' is required"),
    ):
        response = Client().post(url, body, content_type="application/json", **bearer(raw))
        assert response.status_code == 400
        assert says in response.json()["error"]


def test_another_users_answer_is_a_404_for_votes_and_usage_is_ones_own(user, other_user):
    recorded(user, "mine")
    _, raw = api_key_create(user=other_user, name="theirs")
    response = Client().post(
        "/api/v1/requests/mine/feedback",
        {"vote": "down"},
        content_type="application/json",
        **bearer(raw),
    )
    assert response.status_code == 404
    assert not Feedback.objects.exists()
    usage = Client().get("/api/v1/usage", **bearer(raw)).json()
    assert usage["data"] == [] and usage["plan"]["tokens_last_24h"] == 0


def test_a_key_sees_its_own_usage_and_the_plan_it_counts_against(user):
    key, raw = api_key_create(user=user, name="script")
    recorded(user, "by-key", api_key=raw)
    recorded(user, "by-page", conversation=conversation_create(owner=user))
    body = Client().get("/api/v1/usage?granularity=hour&days=1", **bearer(raw)).json()
    assert body["key"] == {"id": key.id, "name": "script", "prefix": key.prefix}
    assert [
        (r["requests"], r["prompt_tokens"], r["cached_prompt_tokens"]) for r in body["data"]
    ] == [(1, 100, 60)]
    # The plan's limits count everything the user sent, by any key or the page.
    assert body["plan"]["tokens_last_24h"] == 240
    response = Client().get("/api/v1/usage?days=0", **bearer(raw))
    assert response.status_code == 400 and "'days'" in response.json()["error"]
    assert Client().get("/api/v1/usage").status_code == 401


def test_the_page_shows_thumbs_and_a_form_post_without_javascript_works(user, client_for):
    conversation = conversation_create(owner=user)
    recorded(user, "r1", conversation=conversation, text="Blue.")
    client = client_for(user)
    page = client.get(f"/c/{conversation.id}/").content.decode()
    assert 'action="/api/v1/requests/r1/feedback"' in page
    assert 'aria-label="Good answer"' in page and 'id="feedback-template"' in page
    response = client.post(
        "/api/v1/requests/r1/feedback", {"vote": "up", "next": f"/c/{conversation.id}/"}
    )
    assert response.status_code == 303 and response["Location"] == f"/c/{conversation.id}/"
    page = client.get(f"/c/{conversation.id}/").content.decode()
    assert 'value="up" class="link feedback-vote" aria-pressed="true"' in page


def test_erase_removes_feedback_and_export_includes_it(user):
    conversation = conversation_create(owner=user)
    recorded(user, "r1", conversation=conversation)
    Feedback.objects.create(user=user, request_id="r1", conversation_id=conversation.id, vote=-1)
    assert user_export_all(user=user)["feedback"][0]["vote"] == "down"
    conversation_erase(conversation=conversation)
    assert not Feedback.objects.exists()
    assert RequestUsage.objects.filter(request_id="r1").exists()  # accounting has no text


def test_the_profile_shows_usage_against_the_plan(user, client_for):
    recorded(user, "r1")
    page = client_for(user).get("/accounts/profile/").content.decode()
    assert "Your usage" in page and "120 of" in page
    assert "a question waits its turn or is refused" in page


def test_admin_pages_answer_the_tuning_questions(user, other_user, admin_client):
    chunk = cited_chunk()
    conversation = conversation_create(owner=user)
    recorded(
        user,
        "r1",
        conversation=conversation,
        citations=[{"number": 1, "chunk_id": chunk.id, "document_id": chunk.document_id}],
    )
    recorded(other_user, "r2")
    Feedback.objects.create(
        user=user,
        request_id="r1",
        vote=-1,
        model="smollm2",
        passages=[chunk.id],
        corpora=[chunk.corpus_id],
        comment="Not blue",
    )
    page = admin_client.get("/admin/ops/usage/?days=7").content.decode()
    assert "alice" in page and "mallory" in page and "Prompt served from cache" in page
    assert "60.0 %" in page  # 120 of 200 prompt tokens came from the cache
    limits = admin_client.get("/admin/ops/usage/?user=alice").content.decode()
    assert "alice against the" in limits
    bad = admin_client.get("/admin/ops/usage/?days=x&plan=y").content.decode()
    assert "Days: a whole number" in bad and "Plan: pick one" in bad
    csv = b"".join(admin_client.get("/admin/ops/usage.csv?user=alice").streaming_content)
    lines = csv.decode().splitlines()
    assert lines[0].startswith("hour,user_id,plan_id") and len(lines) == 2
    feedback = admin_client.get("/admin/ops/feedback/").content.decode()
    assert "handbook" in feedback and f"/admin/rag/document/{chunk.document_id}/change/" in feedback
    # Comments are people's words: even a superuser reads them only after giving a reason.
    assert "Not blue" not in feedback
    reason = {"staff_read_reason": "Checking the down-votes on the handbook"}
    feedback = admin_client.post("/admin/ops/feedback/", reason).content.decode()
    assert "Not blue" in feedback
    csv = b"".join(admin_client.get("/admin/ops/feedback.csv").streaming_content).decode()
    assert "r1" in csv and "Not blue" not in csv
    csv = admin_client.post("/admin/ops/feedback.csv", reason).streaming_content
    assert "Not blue" in b"".join(csv).decode()


def test_retention_keeps_sums_longer_than_rows(user, settings):
    settings.USAGE_REQUEST_DAYS, settings.USAGE_ROLLUP_DAYS = 30, 365
    recorded(user, "r1")
    old = timezone.now() - timedelta(days=40)
    RequestUsage.objects.update(created=old)
    HourlyUsage.objects.update(hour=old)
    result = usage_retention_apply()
    assert (result.requests, result.hours) == (1, 0)
    result = usage_retention_apply(now=timezone.now() + timedelta(days=400))
    assert result.hours == 1
