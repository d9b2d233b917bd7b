"""The composer's file upload: signed-in users only, their own chats and files only (404
otherwise), clear 400/413 answers that store nothing, and the file read in the background until
its progress says it is ready."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from apps.chat.services import conversation_create
from apps.rag.models import UserFile
from apps.rag.services import retrieve_for_prompt
from tests.conftest import wait_until

NOTES = b"# Pantry\n\nThe pantry door code is PANTRY-5150; it resets every Sunday.\n"


def _upload(client, name="pantry.md", data=NOTES, **fields):
    return client.post(reverse("chat:attach"), {"file": SimpleUploadedFile(name, data), **fields})


def test_anonymous_uploads_are_sent_to_log_in_and_store_nothing(client, db):
    response = _upload(client)
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert not UserFile.objects.exists()


def test_upload_is_accepted_and_queued(user, client_for, django_capture_on_commit_callbacks):
    conversation = conversation_create(owner=user)
    with django_capture_on_commit_callbacks() as callbacks:
        response = _upload(client_for(user), conversation=conversation.id)
    assert response.status_code == 202
    body = response.json()
    assert body["name"] == "pantry.md" and body["status"] == "queued" and not body["done"]
    # ingestion starts after the commit, off the request
    assert [c for c in callbacks if getattr(c, "__name__", "") == "ingest_soon"]
    entry = UserFile.objects.get(pk=body["id"])
    assert entry.owner == user and entry.conversation_id == conversation.id
    # The same bytes again: the same entry, not a second copy.
    again = _upload(client_for(user), name="copy.md")
    assert again.status_code == 200 and again.json()["id"] == entry.pk


def test_other_users_chats_and_files_are_404(user, other_user, client_for):
    theirs = conversation_create(owner=other_user)
    assert _upload(client_for(user), conversation=theirs.id).status_code == 404
    assert not UserFile.objects.exists()
    entry = UserFile.objects.get(pk=_upload(client_for(other_user)).json()["id"])
    url = reverse("chat:attachment", args=[entry.pk])
    assert client_for(user).get(url).status_code == 404
    assert (
        client_for(user).get(reverse("chat:attachment", args=[entry.pk + 1000])).status_code == 404
    )
    assert client_for(other_user).get(url).json()["id"] == entry.pk
    assert client_for(user).get(reverse("chat:attach")).status_code == 405


@pytest.mark.parametrize(
    ("name", "data", "status", "words"),
    [
        ("slides.pptx", b"PK\x03\x04", 400, "PDF, Markdown, HTML or text"),
        ("empty.md", b"", 400, "empty"),
        ("latin.txt", "naïve".encode("latin-1"), 400, "UTF-8"),
        ("big.md", b"# Big\n" + b"x" * 3000, 413, "at most"),
    ],
)
def test_bad_files_get_a_clear_error_and_nothing_is_stored(
    user, client_for, settings, name, data, status, words
):
    settings.RAG_USER_FILE_MAX_BYTES = 2048
    response = _upload(client_for(user), name=name, data=data)
    assert response.status_code == status
    assert words in response.json()["error"]
    assert not UserFile.objects.exists()


def test_a_request_declaring_a_huge_body_is_refused_before_it_is_read(user, client_for, settings):
    settings.RAG_USER_FILE_MAX_BYTES = 1024
    response = client_for(user).post(
        reverse("chat:attach"),
        data=b"x",
        content_type="application/octet-stream",
        CONTENT_LENGTH=str(10 * 1024 * 1024),
    )
    assert response.status_code == 413 and "at most" in response.json()["error"]


def test_no_file_is_a_400(user, client_for):
    response = client_for(user).post(reverse("chat:attach"), {})
    assert response.status_code == 400 and "Choose a file" in response.json()["error"]


def test_the_file_is_read_in_the_background_until_ready(transactional_db, user, client_for):
    client = client_for(user)
    body = _upload(client).json()
    url = reverse("chat:attachment", args=[body["id"]])
    seen = set()

    def ready():
        state = client.get(url).json()
        seen.add(state["status"])
        return state if state["done"] else None

    state = wait_until(ready, timeout=60, what="the file to be ingested")
    assert state["status"] == "ready", state
    assert state["chunks_total"] >= 1 and "Ready" in state["progress"]
    passages = retrieve_for_prompt(user=user, query="what is the pantry door code")
    assert passages and "PANTRY-5150" in passages[0].text
