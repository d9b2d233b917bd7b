"""Writes of passages: a document's chunks with their vectors and full-text vectors, the
corpus's counts, and its vector index once it is large enough (apps/rag/vector_index.py)."""

from __future__ import annotations

import json
import logging

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.rag import chunking, vector_index
from apps.rag.models import Chunk, Corpus, Document

logger = logging.getLogger("apps.rag.ingestion")


def chunks_write(
    *, document: Document, chunks: list[chunking.Chunk], vectors, slot: int = 0
) -> None:
    """Inserts a document's chunks, embeddings (into the corpus's column, `slot`) and full-text
    vectors in one statement (so the HNSW and GIN indexes see each row once, not an insert and
    then an update)."""
    config = settings.RAG_TEXT_SEARCH_CONFIG
    base = document.metadata or {}
    metadata = [
        {**base, **c.metadata, **({"page": c.page} if c.page is not None else {})} for c in chunks
    ]
    column = vector_index.column(slot)
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO rag_chunk (corpus_id, document_id, ordinal, heading, text, token_count,
                                   char_start, char_end, {column}, search, metadata)
            SELECT %(corpus)s, %(document)s, t.ordinal, t.heading, t.text, t.token_count,
                   t.char_start, t.char_end, t.embedding::vector,
                   setweight(to_tsvector(%(config)s::regconfig, %(title)s || ' ' || t.heading), 'A')
                   || setweight(to_tsvector(%(config)s::regconfig, t.text), 'B'),
                   t.metadata::jsonb
            FROM unnest(%(ordinal)s::int[], %(heading)s::text[], %(text)s::text[],
                        %(tokens)s::int[], %(starts)s::int[], %(ends)s::int[],
                        %(embedding)s::text[], %(metadata)s::text[])
                 AS t(ordinal, heading, text, token_count, char_start, char_end, embedding,
                      metadata)
            """,
            {
                "corpus": document.corpus_id,
                "document": document.pk,
                "config": config,
                "title": document.title,
                "ordinal": [c.ordinal for c in chunks],
                "heading": [c.heading for c in chunks],
                "text": [c.text for c in chunks],
                "tokens": [c.token_count for c in chunks],
                "starts": [c.char_start for c in chunks],
                "ends": [c.char_end for c in chunks],
                "embedding": [vector_literal(v) for v in vectors],
                "metadata": [json.dumps(m) for m in metadata],
            },
        )


def vector_literal(vector) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in vector.tolist()) + "]"


def corpus_refresh_counts(*, corpus_id: int, last_ingest: dict | None = None) -> None:
    updates = {
        "document_count": Document.objects.filter(corpus_id=corpus_id).count(),
        "chunk_count": Chunk.objects.filter(corpus_id=corpus_id).count(),
        "updated": timezone.now(),
    }
    if last_ingest is not None:
        updates["last_ingest"] = last_ingest
    # A corpus whose chunk count leaves or reaches 0 changes who may search it (selectors.py).
    Corpus.objects.filter(pk=corpus_id).update(**updates)


def index_ensure_logged(*, corpus_id: int) -> None:
    """The corpus's HNSW index once it is large enough; a failure to build it (the search then
    scans exactly) never fails the ingestion that brought the passages."""
    corpus = Corpus.objects.get(pk=corpus_id)
    try:
        with transaction.atomic():
            vector_index.corpus_index_ensure(corpus)
    except Exception:
        logger.exception("building the vector index of corpus %s failed", corpus.name)
