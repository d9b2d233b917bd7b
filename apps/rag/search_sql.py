"""The retrieval statement's SQL: one statement gathers the vector and full-text candidates of
the corpora searched, with every component score (apps/rag/retrieval.py fuses them).

Corpora may differ in embedding model and dimension, so the vector list is one ordered scan per
corpus — over its own column, cast to its own dimension, against the question's vector of its
own model — so each scan can walk that corpus's own HNSW index (apps/rag/vector_index.py); the
lists are merged by distance, as one list over all of them was before.
"""

from __future__ import annotations

import struct
import time
from functools import cache

import numpy as np
from django.db import connection
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.types import TypeInfo

from apps.rag.chunking import HEADING_SEPARATOR
from apps.rag.vector_index import column, typed

# The metadata match looks at the passage's own section heading (the last part of its heading
# path): the document's title and the headings above are shared by every passage of a document,
# so a question naming the title's word lifted all of them alike, introductions first.
SECTION_SQL = f"regexp_replace(c.heading, '^.*{HEADING_SEPARATOR}', '')"

# The full-text list ranks the passages sharing the most of the question's words first
# (ts_rank_cd over the words OR-ed), but ranking every passage that shares one common word grows
# with the corpus (thousands of rows at 100,000 chunks). So the pool it ranks is bounded: the
# passages holding all the words, plus, for each word that is not common (PostgreSQL's own
# statistics of the column list the common ones), the first RAG_FULLTEXT_POOL_PER_TERM passages
# holding it. A rare word (a name, an identifier) thus always brings its passages.
CANDIDATES_SQL = """
WITH means AS MATERIALIZED (
    SELECT m.corpus_id, m.mean::vector AS mean
    FROM unnest(%(mean_ids)s::bigint[], %(means)s::text[]) AS m(corpus_id, mean)
),
terms AS (
    SELECT plainto_tsquery('simple', lexeme) AS q
    FROM unnest(to_tsvector(%(config)s::regconfig, %(query)s))
    WHERE lexeme <> ALL(%(common)s::text[])
    LIMIT %(max_terms)s
),
tq AS (
    SELECT NULLIF(replace(plainto_tsquery(%(config)s::regconfig, %(query)s)::text, ' & ', ' | '),
                  '')::tsquery AS q
),
probes AS (
    SELECT plainto_tsquery(%(config)s::regconfig, %(query)s) AS q
    UNION ALL SELECT q FROM terms
),
pool AS (
    SELECT DISTINCT m.id FROM probes p CROSS JOIN LATERAL (
        SELECT c.id FROM rag_chunk c
        WHERE c.corpus_id = ANY(%(corpora)s) AND c.search @@ p.q {filter}
        LIMIT %(per_term)s
    ) m
),
vec AS (
    SELECT v.id FROM ({vector_lists}) v ORDER BY v.d LIMIT %(candidates)s
),
txt AS (
    SELECT c.id FROM pool JOIN rag_chunk c ON c.id = pool.id, tq
    ORDER BY ts_rank_cd(c.search, tq.q) DESC
    LIMIT %(candidates)s
),
cand AS (SELECT id FROM vec UNION SELECT id FROM txt)
SELECT c.id, c.corpus_id, c.document_id, d.title, c.heading, c.text, c.metadata,
       COALESCE(1 - {distance}, 0) AS vector_score,
       (SELECT -({vector} <#> m.mean) FROM means m WHERE m.corpus_id = c.corpus_id) AS mean_dot,
       COALESCE(ts_rank_cd(c.search, tq.q), 0) AS text_rank,
       COALESCE(to_tsvector(%(config)s::regconfig, {section}) @@ tq.q, false) AS title_match,
       {boost} AS boost_match,
       c.id IN (SELECT id FROM vec) AS from_vec
FROM cand JOIN rag_chunk c ON c.id = cand.id JOIN rag_document d ON d.id = c.document_id, tq
"""


_common: tuple[float, str] = (0.0, "{}")
COMMON_ROWS = 500  # a word in more chunks than this is left to the all-words probe
COMMON_REFRESH_SECONDS = 600


def common_lexemes() -> str:
    """Words in more than COMMON_ROWS chunks, from the statistics ANALYZE keeps (refreshed every
    ten minutes per process; empty before the table is first analysed), as one text[] literal:
    hundreds of words, so formatted once here rather than adapted element by element per query."""
    global _common
    fetched, words = _common
    if time.monotonic() - fetched < COMMON_REFRESH_SECONDS:
        return words
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT COALESCE(array_agg(u.e ORDER BY u.e), '{}')::text FROM pg_stats s
            JOIN pg_class c ON c.relname = s.tablename,
                 unnest(s.most_common_elems::text::text[], s.most_common_elem_freqs) AS u(e, f)
            WHERE s.tablename = 'rag_chunk' AND s.attname = 'search'
              AND s.schemaname = current_schema() AND u.e IS NOT NULL
              AND u.f * c.reltuples > %s
            """,
            [COMMON_ROWS],
        )
        words = cursor.fetchone()[0]
    _common = (time.monotonic(), words)
    return words


def vector_sql(corpora, models: list[str], *, exact: bool) -> dict[str, str]:
    """The statement's per-corpus parts: `vector_lists` (each corpus's nearest passages),
    `distance` and `vector` (a candidate's distance to the question and its stored vector, by
    its corpus). The question's vector for model `models[i]` is parameter `q{i}`."""
    lists, distance, vector = [], [], []
    for corpus in corpora:
        dims = int(corpus.embedding_dimensions)
        param = f"%(q{models.index(corpus.embedding_model)})s::vector({dims})"
        # "+ 0" hides the ORDER BY from the HNSW index: an exact scan. (The distance is in
        # parentheses: `<=>` binds looser than `+`, which would add 0 to the vector.)
        near = f"({typed(corpus)} <=> {param})"
        lists.append(
            f"(SELECT c.id, {near} AS d FROM rag_chunk c WHERE c.corpus_id = {int(corpus.pk)} "
            f"{{filter}} ORDER BY {near} {'+ 0' if exact else ''} LIMIT %(candidates)s)"
        )
        distance.append(f"WHEN {int(corpus.pk)} THEN {near}")
        vector.append(f"WHEN {int(corpus.pk)} THEN c.{column(corpus.embedding_slot)}")
    return {
        "vector_lists": " UNION ALL ".join(lists),
        "distance": f"(CASE c.corpus_id {' '.join(distance)} END)",
        "vector": f"(CASE c.corpus_id {' '.join(vector)} END)",
    }


def statement(corpora, models: list[str], *, filter_sql: str, boost_sql: str, exact: bool) -> str:
    parts = vector_sql(corpora, models, exact=exact)
    parts["vector_lists"] = parts["vector_lists"].replace("{filter}", filter_sql)
    return CANDIDATES_SQL.format(filter=filter_sql, boost=boost_sql, section=SECTION_SQL, **parts)


# -- the question's vector as a statement parameter ------------------------------------------


class QueryVector:
    """The query embedding as a statement parameter, sent in pgvector's binary form: no 384
    numbers to format here and parse on the server."""

    __slots__ = ("payload",)

    def __init__(self, embedding) -> None:
        values = np.asarray(embedding, dtype=">f4")  # big-endian float4, as vector_recv reads
        self.payload = struct.pack(">HH", len(values), 0) + values.tobytes()


class _VectorDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: QueryVector) -> bytes:
        return obj.payload


@cache
def vector_dumper(oid: int) -> type[Dumper]:
    return type("VectorDumper", (_VectorDumper,), {"oid": oid})


def vector_oid(raw) -> int:
    """pgvector's type oid, looked up once per connection (it differs between databases)."""
    info = raw.adapters.types.get("vector")
    if info is None:
        info = TypeInfo.fetch(raw, "vector")
        info.register(raw)
    return info.oid
