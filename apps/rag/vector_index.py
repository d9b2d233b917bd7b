"""Where a corpus's vectors live, and its HNSW index.

Every corpus's passages are rows of one table, `rag_chunk`, whose two vector columns have no
fixed dimension; a corpus's vectors are in the column its `embedding_slot` names, and its HNSW
index is a partial expression index over that column cast to the corpus's dimension:

    CREATE INDEX rag_chunk_vec_c7_s0 ON rag_chunk
        USING hnsw ((embedding::vector(1024)) vector_cosine_ops) WHERE corpus_id = 7

Why one table with per-corpus partial indexes rather than a table per dimension: a search
keeps its access rules, metadata filter, full-text match and vector match in one statement
over one table (apps/rag/retrieval.py); ingestion, deletion and the previous release's code
keep writing one table; no table is created while the service runs; and each corpus gets a
graph of its own, so a small corpus is never lost in a large one's (HNSW filters after its
search, which made searches of small corpora fall back to exact scans). The cast in the index
also rejects a vector of the wrong length when it is written. The second column is what makes a
model change cheap to swap: the new model's vectors fill the free column, its index is built,
then the corpus points at it in one update.

Corpora below RAG_HNSW_MIN_CHUNKS passages get no index: an exact scan of a few hundred rows
(found by the corpus_id index) is as fast, and thousands of users' small corpora would
otherwise each add an index the planner weighs on every query.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection

log = logging.getLogger("sluice.rag.index")

COLUMNS = ("embedding", "embedding_alt")
# A wider search while building gives a better graph: on 100,000 clustered passages
# ef_construction 64 needs ef_search 100 for 0.95 recall@10, 200 reaches it at pgvector's
# default ef_search of 40, so each query walks less than half as far.
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 200


def column(slot: int) -> str:
    return COLUMNS[slot]


def typed(corpus, alias: str = "c") -> str:
    """SQL of the corpus's vector: its column cast to its dimension (the index's expression)."""
    return f"({alias}.{column(corpus.embedding_slot)}::vector({int(corpus.embedding_dimensions)}))"


def index_name(corpus_id: int, slot: int) -> str:
    return f"rag_chunk_vec_c{int(corpus_id)}_s{int(slot)}"


def _index_state(name: str) -> bool | None:
    """True: a valid index of that name; False: an invalid one (a concurrent build that
    failed); None: none."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %s",
            [name],
        )
        row = cursor.fetchone()
    return None if row is None else bool(row[0])


def index_ensure(*, corpus_id: int, slot: int, dimensions: int, force: bool = False) -> bool:
    """Builds the corpus's HNSW index over `slot` at `dimensions` when the corpus has
    RAG_HNSW_MIN_CHUNKS passages there (or `force`); returns whether one exists now. Outside a
    transaction it builds CONCURRENTLY, so ingestion and searches go on meanwhile."""
    name = index_name(corpus_id, slot)
    state = _index_state(name)
    if state:
        return True
    col = column(slot)
    if not force:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT count(*) FROM rag_chunk WHERE corpus_id = %s AND {col} IS NOT NULL",
                [corpus_id],
            )
            if cursor.fetchone()[0] < settings.RAG_HNSW_MIN_CHUNKS:
                return False
    concurrently = "" if connection.in_atomic_block else "CONCURRENTLY"
    with connection.cursor() as cursor:
        if connection.in_atomic_block:
            # Inside a transaction that wrote rows, their deferred foreign-key checks must run
            # first: PostgreSQL builds no index over a table with checks pending.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        if state is False:
            cursor.execute(f"DROP INDEX {concurrently} IF EXISTS {name}")
        cursor.execute(
            f"CREATE INDEX {concurrently} IF NOT EXISTS {name} ON rag_chunk USING hnsw "
            f"(({col}::vector({int(dimensions)})) vector_cosine_ops) "
            f"WITH (m = {HNSW_M}, ef_construction = {HNSW_EF_CONSTRUCTION}) "
            f"WHERE corpus_id = {int(corpus_id)}"
        )
    log.info("built %s (%d dimensions)", name, dimensions)
    return True


def index_drop(*, corpus_id: int, slot: int) -> None:
    concurrently = "" if connection.in_atomic_block else "CONCURRENTLY"
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX {concurrently} IF EXISTS {index_name(corpus_id, slot)}")


def corpus_index_ensure(corpus) -> bool:
    """The corpus's index for its current model, when it is large enough (after ingestion)."""
    return index_ensure(
        corpus_id=corpus.pk, slot=corpus.embedding_slot, dimensions=corpus.embedding_dimensions
    )
