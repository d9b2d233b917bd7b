"""How the retrieval statement reaches PostgreSQL: the query vector, the HNSW search breadth,
with or without a surrounding transaction, and the full-text index the search reads."""

from __future__ import annotations

import numpy as np
import pytest
from django.db import connection

from apps.rag import retrieval
from apps.rag.models import Chunk


def _stored_embedding(chunk: Chunk) -> np.ndarray:
    return np.asarray(chunk.embedding, dtype=np.float32)


def test_a_stored_passage_is_its_own_nearest_neighbour(handbook):
    # The query vector travels in binary form; a stored passage's own vector must find it with
    # a cosine similarity of one.
    chunk = Chunk.objects.filter(corpus=handbook).order_by("pk")[3]
    passages = retrieval.search(
        corpora=[handbook],
        query=chunk.heading or "passage",
        embedding=_stored_embedding(chunk),
        k=3,
        weights=retrieval.Weights(1, 0, 0),
    )
    assert passages[0].chunk_id == chunk.pk
    assert passages[0].vector_score == pytest.approx(1.0, abs=1e-5)
    assert passages[0].vector_rank == 1


def test_the_configured_search_breadth_applies(handbook, settings):
    settings.RAG_HNSW_EF_SEARCH = 64
    chunk = Chunk.objects.filter(corpus=handbook).first()
    retrieval.search(corpora=[handbook], query="vacation", embedding=_stored_embedding(chunk))
    with connection.cursor() as cursor:
        cursor.execute("SHOW hnsw.ef_search")
        assert cursor.fetchone()[0] == "64"


def test_a_larger_candidate_pool_widens_the_search(handbook, settings):
    settings.RAG_HNSW_EF_SEARCH = 40
    chunk = Chunk.objects.filter(corpus=handbook).first()
    retrieval.search(
        corpora=[handbook], query="vacation", embedding=_stored_embedding(chunk), candidates=90
    )
    with connection.cursor() as cursor:
        cursor.execute("SHOW hnsw.ef_search")
        assert cursor.fetchone()[0] == "90"


@pytest.mark.django_db(transaction=True)
def test_search_outside_a_transaction(handbook, user):
    # The chat calls retrieval in autocommit mode; the tests above run inside a transaction.
    assert not connection.in_atomic_block
    chunk = Chunk.objects.filter(corpus=handbook).order_by("pk")[2]
    passages = retrieval.search(
        corpora=[handbook], query="vacation", embedding=_stored_embedding(chunk), k=2
    )
    assert passages
    assert chunk.pk in {p.chunk_id for p in passages}
    assert connection.connection.info.transaction_status == 0  # idle: nothing left open


def test_full_text_index_has_no_pending_list(db):
    # A pending list would be scanned by every search until VACUUM merges it.
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'rag_chunk_search_gin'")
        assert "fastupdate=off" in cursor.fetchone()[0]
