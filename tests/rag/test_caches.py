"""Query embeddings cached in process and in Redis; results cached per corpus version and
invalidated by any change to the corpus."""

from __future__ import annotations

import numpy as np

from apps.rag import caches
from apps.rag.models import Corpus, Document
from apps.rag.services import corpus_ingest_paths, document_delete, retrieve_for_prompt
from core.redis_client import get_redis, keys

QUERY = "Which day is the billing release cut?"


def redis_keys(pattern: str) -> list[str]:
    kind, _, digest = pattern.partition(":")
    return list(get_redis().scan_iter(match=keys().rag_cache(kind, digest)))


def test_query_embedding_is_cached_in_redis_and_in_process(embedding_model, redis_prefix):
    caches.clear_local()
    first = caches.query_embedding("  what is   Sluice? ")
    assert len(redis_keys("qemb:*")) == 1
    caches.clear_local()  # a fresh process: served from Redis, same vector
    again = caches.query_embedding("what is Sluice?")
    assert np.array_equal(first, again)
    assert first.shape == (384,) and abs(float(np.linalg.norm(first)) - 1) < 1e-4


def test_results_are_cached_and_invalidated_on_reingest(handbook, user, tmp_path):
    before = retrieve_for_prompt(user=user, query=QUERY)
    assert "Tuesday" in before[0].text
    assert len(redis_keys("res:*")) == 1
    assert retrieve_for_prompt(user=user, query=QUERY) == before  # served from the cache
    assert len(redis_keys("res:*")) == 1

    changed = tmp_path / "deploy.md"
    changed.write_text(
        "# Deploying the billing service\n\nThe billing release is now cut every Thursday.\n"
    )
    Document.objects.filter(title="Deploying the billing service").update(
        source=corpus_source(changed)
    )
    corpus_ingest_paths(corpus=handbook, paths=[str(changed)])
    after = retrieve_for_prompt(user=user, query=QUERY)
    assert "Thursday" in after[0].text
    assert all("Tuesday" not in p.text for p in after)
    assert len(redis_keys("res:*")) == 2  # a new key: the corpus version changed


def test_deleting_a_document_invalidates(handbook, user):
    before = retrieve_for_prompt(user=user, query=QUERY)
    version = Corpus.objects.get(pk=handbook.pk).version
    document_delete(document=Document.objects.get(pk=before[0].document_id))
    assert Corpus.objects.get(pk=handbook.pk).version == version + 1
    after = retrieve_for_prompt(user=user, query=QUERY)
    assert before[0].document_id not in {p.document_id for p in after}


def corpus_source(path) -> str:
    from apps.rag.ingestion import source_name

    return source_name(path)
