"""The corpus admin: counts and status, upload, try a query, reindex and delete."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from apps.accounts.services import user_create
from apps.rag.models import Chunk, Corpus, Document


@pytest.fixture
def admin_client(db, client_for):
    admin = user_create(username="root", password="correct-horse-battery")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    return client_for(admin)


def test_changelist_shows_counts_and_status(handbook, admin_client):
    page = admin_client.get(reverse("admin:rag_corpus_changelist")).content.decode()
    assert "handbook" in page and "Try a query" in page
    assert f">{handbook.chunk_count}<" in page and ">5<" in page
    assert "+5 ~0 =0" in page  # last ingestion: 5 added


def test_upload_ingests_and_reports_bad_files(handbook, admin_client):
    url = reverse("admin:rag_corpus_upload", args=[handbook.pk])
    response = admin_client.post(
        url,
        {
            "files": [
                SimpleUploadedFile("parking.md", b"# Parking\n\nPark in level -2 after 6pm."),
                SimpleUploadedFile("empty.txt", b""),
            ]
        },
        follow=True,
    )
    page = response.content.decode()
    assert "1 added" in page and "FAILED upload/empty.txt: empty file" in page
    assert Document.objects.filter(corpus=handbook, source="upload/parking.md").exists()


def test_try_a_query_shows_each_component_score(handbook, admin_client):
    page = admin_client.get(
        reverse("admin:rag_corpus_try"), {"query": "roll back a billing release", "k": 3}
    ).content.decode()
    assert "Fused ranking" in page
    assert "Deploying the billing service &gt; Rolling back" in page
    for column in ("fused", "vector (rank)", "full text (rank)", "metadata"):
        assert column in page
    bad = admin_client.get(
        reverse("admin:rag_corpus_try"), {"query": "x", "k": 3, "boost": "[1]"}
    ).content.decode()
    assert "must be a JSON object" in bad


def test_delete_and_reindex_documents(handbook, admin_client):
    document = Document.objects.get(title="Birds")
    version = handbook.version
    admin_client.post(
        reverse("admin:rag_document_changelist"),
        {"action": "delete_selected", "_selected_action": [document.pk], "post": "yes"},
    )
    handbook.refresh_from_db()
    assert not Document.objects.filter(pk=document.pk).exists()
    assert handbook.document_count == 4 and handbook.version > version
    assert not Chunk.objects.filter(document_id=document.pk).exists()

    other = Document.objects.filter(corpus=handbook).first()
    old_ids = set(other.chunks.values_list("id", flat=True))
    admin_client.post(
        reverse("admin:rag_document_changelist"),
        {"action": "reindex_selected", "_selected_action": [other.pk]},
    )
    assert set(other.chunks.values_list("id", flat=True)).isdisjoint(old_ids)


def test_changing_weights_invalidates_cached_results(handbook, admin_client):
    version = Corpus.objects.get(pk=handbook.pk).version
    url = reverse("admin:rag_corpus_change", args=[handbook.pk])
    data = {
        "name": "handbook",
        "title": "",
        "description": "",
        "is_active": "on",
        "access": "everyone",
        "plans": "",
        "fusion": "rrf",
        "vector_weight": "0.5",
        "text_weight": "0.5",
        "metadata_weight": "0",
    }
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.content.decode()[:2000]
    corpus = Corpus.objects.get(pk=handbook.pk)
    assert corpus.fusion == "rrf" and corpus.version == version + 1
    data.update(vector_weight="0", text_weight="0")
    page = admin_client.post(url, data).content.decode()
    assert "At least one retrieval weight must be above zero." in page


def test_a_corpus_names_its_own_reranker(handbook, admin_client, tmp_path):
    url = reverse("admin:rag_corpus_change", args=[handbook.pk])
    data = {
        "name": "handbook",
        "access": "everyone",
        "is_active": "on",
        "fusion": "weighted",
        "vector_weight": "0.7",
        "text_weight": "0.07",
        "metadata_weight": "0.03",
        "rerank_model": str(tmp_path / "absent"),
    }
    page = admin_client.post(url, data).content.decode()
    assert "No reranker at" in page  # not on this machine: refused, nothing saved
    assert Corpus.objects.get(pk=handbook.pk).rerank_model is None
    response = admin_client.post(url, {**data, "rerank_model": "fleet:bge-reranker-v2-m3"})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Corpus.objects.get(pk=handbook.pk).rerank_model == "fleet:bge-reranker-v2-m3"
    admin_client.post(url, {**data, "rerank_model": ""})
    assert Corpus.objects.get(pk=handbook.pk).rerank_model is None  # empty: the default
