"""Hybrid retrieval: HNSW vector top-k and full-text top-k, fused by each corpus's weights.

One SQL statement gathers the candidates (the vector list and the full-text list, each limited
to the corpora the caller may search, in SQL) with every component score; the fusion itself runs
here on those few dozen rows, where each candidate's own corpus weights apply.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np
import psycopg
from django.conf import settings
from django.db import connection
from django.urls import reverse

from apps.rag import centering, search_sql
from apps.rag import rerank as reranking
from apps.rag.models import Corpus
from apps.rag.search_sql import QueryVector, vector_dumper, vector_oid
from apps.rag.snippets import display_title, snippet

RRF_K = 60  # the usual constant of reciprocal rank fusion: dampens the head of each list


@dataclass
class Passage:
    number: int  # 1-based, as cited: [1], [2]
    chunk_id: int
    document_id: int
    corpus_id: int
    title: str
    heading: str
    text: str
    snippet: str
    source_url: str
    score: float  # fused
    vector_score: float  # cosine similarity, centred (apps.rag.centering)
    text_score: float  # ts_rank_cd relative to the best full-text candidate
    metadata_score: float  # 1 when its section heading matches the query or the boost matches
    vector_rank: int | None = None
    text_rank: int | None = None
    metadata: dict = field(default_factory=dict)
    rerank_score: float | None = None  # the cross-encoder's, when that stage ran

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Weights:
    vector: float
    text: float
    metadata: float

    @classmethod
    def of(cls, corpus: Corpus) -> Weights:
        return cls(corpus.vector_weight, corpus.text_weight, corpus.metadata_weight)


def search(
    *,
    corpora: list[Corpus],
    query: str,
    embedding: np.ndarray | dict[str, np.ndarray],
    k: int = 4,
    metadata_filter: dict | None = None,
    boost: dict | None = None,
    fusion: str | None = None,
    weights: Weights | None = None,
    candidates: int | None = None,
    min_similarity: float | None = None,
    exact: bool = False,
    rerank: bool = True,
) -> list[Passage]:
    """The top `k` passages of `corpora` for `query` (whose embedding the caller computed:
    one vector when every corpus has the same model, else {model: vector}; see
    caches.query_embeddings).

    `corpora` must already be the ones the caller may search: this function trusts the list.
    `fusion` and `weights` override the corpora's own (the admin's "try a query" page does).
    `exact`: both candidate lists without approximation (an exact vector scan, every passage
    sharing a word ranked): what the service's search is measured against. `rerank`: the
    second stage, for the passages of corpora that have a reranker (their own, else
    settings.RAG_RERANK_MODEL: apps.rag.rerank).
    """
    if not corpora or not query.strip() or k < 1:
        return []
    candidates = max(candidates or settings.RAG_CANDIDATES, k)
    share = settings.RAG_MEAN_REMOVAL
    vectors = by_model(corpora, embedding)
    means = centering.corpus_means(corpora) if share > 0 else {}
    rows = _candidates(
        corpora=corpora,
        query=query,
        embedding=vectors,
        metadata_filter=metadata_filter,
        boost=boost,
        candidates=candidates,
        exact=exact,
        means=means,
    )
    by_corpus = {c.pk: c for c in corpora}
    for r in rows:
        mean = means.get(r["corpus_id"])
        if mean is not None and r["mean_dot"] is not None:
            query_vector = vectors[by_corpus[r["corpus_id"]].embedding_model]
            r["vector_score"] = centering.centered(
                float(r["vector_score"]),
                query_dot=float(query_vector @ mean),
                passage_dot=float(r["mean_dot"]),
                mean_sq=float(mean @ mean),
                share=share,
            )
    if fusion is None:
        # Scores of the two methods are not comparable: mixing corpora of both fuses by weights.
        fusion = "rrf" if all(c.fusion == Corpus.Fusion.RRF for c in corpora) else "weighted"
    ranked = _fuse(rows, by_corpus=by_corpus, fusion=fusion, weights=weights)
    best: dict[int, float] = {}
    for s in ranked:
        best[s.row["corpus_id"]] = max(best.get(s.row["corpus_id"], -1.0), s.vector)
    ranked = [
        s
        for s in ranked
        if relevant(s, by_corpus[s.row["corpus_id"]], min_similarity, best[s.row["corpus_id"]])
    ]
    if rerank:
        ranked = reranking.reorder_by_corpus(query, ranked, by_corpus=by_corpus)
    return [s.passage(number, query) for number, s in enumerate(ranked[:k], start=1)]


# Below a calibrated floor, how far a passage of an admitted question may sit.
RELEVANCE_MARGIN = 0.1


def relevant(
    scored: _Scored, corpus: Corpus, min_similarity: float | None, best: float = 1.0
) -> bool:
    """The relevance gate: is the passage worth the model's reading time? A calibrated corpus
    (`relevance_floor`, see apps.rag.relevance) decides by cosine similarity alone: a shared
    common word says little, and off-topic questions share one often. The floor admits the
    question (by `best`, its best passage's similarity in this corpus, which is what the
    calibration measures); its passages then pass within RELEVANCE_MARGIN of the floor, since
    the passage that answers often scores a little below a neighbour that merely matches.
    Otherwise the RAG_MIN_SIMILARITY default, or any full-text match. `min_similarity`
    overrides both (the admin's "try a query" page and the evaluation show the whole
    ranking)."""
    if min_similarity is not None:
        return scored.vector >= min_similarity or scored.text > 0
    floor = corpus.relevance_floor
    if floor is not None:
        return best >= floor and scored.vector >= floor - RELEVANCE_MARGIN
    return scored.vector >= settings.RAG_MIN_SIMILARITY or scored.text > 0


def by_model(corpora: list[Corpus], embedding) -> dict[str, np.ndarray]:
    """The question's vector for each model the corpora use; a corpus whose model's vector is
    missing, or of another length than its own vectors, is a caller's error said plainly."""
    given = embedding if isinstance(embedding, dict) else None
    vectors = {}
    for corpus in corpora:
        model = corpus.embedding_model
        vector = given.get(model) if given is not None else embedding
        if vector is None:
            raise ValueError(f"no question vector of {model!r} for corpus {corpus.name!r}")
        vector = np.asarray(vector, dtype=np.float32)
        if vector.shape != (corpus.embedding_dimensions,):
            raise ValueError(
                f"corpus {corpus.name!r} holds {corpus.embedding_dimensions}-dimension vectors "
                f"of {model!r}; the question's has {vector.shape[-1]}"
            )
        vectors[model] = vector
    return vectors


def _candidates(
    *, corpora, query, embedding, metadata_filter, boost, candidates, exact=False, means
) -> list[dict]:
    models = list(embedding)
    params = {
        **centering.means_params(means),
        **{f"q{i}": QueryVector(embedding[model]) for i, model in enumerate(models)},
        "config": settings.RAG_TEXT_SEARCH_CONFIG,
        "query": query,
        "corpora": [c.pk for c in corpora],
        "candidates": candidates,
        "per_term": max(candidates, settings.RAG_FULLTEXT_POOL_PER_TERM),
        "max_terms": 8,
        "common": search_sql.common_lexemes(),
        "filter": json.dumps(metadata_filter or {}),
        "boost": json.dumps(boost or {}),
    }
    filter_sql = "AND c.metadata @> %(filter)s::jsonb" if metadata_filter else ""
    boost_sql = "c.metadata @> %(boost)s::jsonb" if boost else "false"
    ef_search = max(settings.RAG_HNSW_EF_SEARCH, candidates)
    shape = {"corpora": corpora, "models": models, "ef_search": ef_search}
    if exact:
        params.update(per_term=2**31 - 1, common="{}", max_terms=64)
        return _run(params, filter_sql, boost_sql, exact=True, **shape)
    rows = _run(params, filter_sql, boost_sql, exact=False, **shape)
    # HNSW filters after its search: when the allowed corpora are a small part of the table, or
    # its entries point at rows deleted since (a re-ingest, until vacuum), the index returns few
    # live rows of theirs. Then an exact scan over those corpora finds them.
    found = sum(1 for r in rows if r["from_vec"])
    available = sum(c.chunk_count for c in corpora)
    if found < min(candidates // 2, available):
        rows = _run(params, filter_sql, boost_sql, exact=True, **shape)
    return rows


def _run(
    params, filter_sql, boost_sql, *, exact: bool, ef_search: int, corpora, models
) -> list[dict]:
    sql = search_sql.statement(
        corpora, models, filter_sql=filter_sql, boost_sql=boost_sql, exact=exact
    )
    connection.ensure_connection()
    raw = connection.connection
    with psycopg.Cursor(raw) as cursor:
        cursor.adapters.register_dumper(QueryVector, vector_dumper(vector_oid(raw)))
        # One round trip: the search breadth and the statement travel together (a SET LOCAL
        # would need a transaction, so a BEGIN and a COMMIT more). The setting stays on the
        # session, which is harmless: every search here sets it first. (Preparing the statement
        # would not help: its generic plan is many times slower, and with custom plans only
        # the parse is saved.)
        with raw.pipeline():
            raw.execute(SET_EF_SEARCH, [str(ef_search)])
            cursor.execute(sql, params)
        return _dicts(cursor)


SET_EF_SEARCH = "SELECT set_config('hnsw.ef_search', %s, false)"


def _dicts(cursor) -> list[dict]:
    names = [col.name for col in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


@dataclass
class _Scored:
    row: dict
    score: float
    vector: float
    text: float
    metadata: float
    vector_rank: int
    text_rank: int | None
    rerank: float | None = None

    def passage(self, number: int, query: str) -> Passage:
        r = self.row
        return Passage(
            number=number,
            chunk_id=r["id"],
            document_id=r["document_id"],
            corpus_id=r["corpus_id"],
            title=display_title(r["title"], r["heading"]),
            heading=r["heading"],
            text=r["text"],
            snippet=snippet(r["text"], query),
            source_url=reverse("rag:chunk", args=[r["id"]]),
            score=round(self.score, 6),
            vector_score=round(self.vector, 6),
            text_score=round(self.text, 6),
            metadata_score=self.metadata,
            vector_rank=self.vector_rank,
            text_rank=self.text_rank,
            metadata=_json(r["metadata"]),
            rerank_score=None if self.rerank is None else round(self.rerank, 6),
        )


def _fuse(rows, *, by_corpus, fusion, weights) -> list[_Scored]:
    """Every candidate with its fused and component scores, best first."""
    if not rows:
        return []
    best_text = max(r["text_rank"] for r in rows) or 1.0
    vector_order = sorted(rows, key=lambda r: -r["vector_score"])
    vector_rank = {r["id"]: i for i, r in enumerate(vector_order, start=1)}
    text_order = sorted((r for r in rows if r["text_rank"] > 0), key=lambda r: -r["text_rank"])
    text_rank = {r["id"]: i for i, r in enumerate(text_order, start=1)}
    meta_order = [r for r in vector_order if r["title_match"] or r["boost_match"]]
    meta_rank = {r["id"]: i for i, r in enumerate(meta_order, start=1)}
    scored = []
    for r in rows:
        w = weights or Weights.of(by_corpus[r["corpus_id"]])
        v = max(0.0, float(r["vector_score"]))
        t = float(r["text_rank"]) / best_text
        m = 1.0 if (r["title_match"] or r["boost_match"]) else 0.0
        if fusion == "rrf":
            score = w.vector / (RRF_K + vector_rank[r["id"]])
            score += w.text / (RRF_K + text_rank[r["id"]]) if r["id"] in text_rank else 0.0
            score += w.metadata / (RRF_K + meta_rank[r["id"]]) if r["id"] in meta_rank else 0.0
        else:
            score = w.vector * v + w.text * t + w.metadata * m
        scored.append(_Scored(r, score, v, t, m, vector_rank[r["id"]], text_rank.get(r["id"])))
    scored.sort(key=lambda s: (-s.score, -s.vector, s.row["id"]))
    return scored


def _json(value) -> dict:
    # Django's psycopg setup hands jsonb over as text.
    return json.loads(value) if isinstance(value, str) else (value or {})
