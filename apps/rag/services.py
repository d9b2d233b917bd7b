"""Writes and the retrieval entry point the chat's prompt building calls.

`retrieval_for_prompt` is the contract with the request path: the passages a user may see for a
question, numbered for citation, cached, ACL-filtered in SQL, and whether retrieval was
unavailable (`retrieve_for_prompt`: the passages alone).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.db.models import F

from apps.rag import caches, fleet, retrieval
from apps.rag.ingestion import Ingestor, IngestReport, corpus_refresh_counts, extracted_from
from apps.rag.models import Corpus, Document
from apps.rag.prompting import passages_within
from apps.rag.retrieval import Passage
from apps.rag.selectors import searchable_corpora_for_user

__all__ = [
    "RETRIEVAL_UNAVAILABLE_NOTICE",
    "Passage",
    "Retrieval",
    "RetrievalRefused",
    "corpus_bump_version",
    "corpus_get_or_create",
    "corpus_ingest_paths",
    "corpus_ingest_uploads",
    "corpus_reindex",
    "corpus_set_relevance_floor",
    "document_delete",
    "documents_reindex",
    "retrieval_for_prompt",
    "retrieve_for_prompt",
]


log = logging.getLogger("sluice.rag")


class RetrievalRefused(Exception):
    """The question's embedding could not be had and RAG_EMBEDDING_UNAVAILABLE is "refuse":
    the question is not sent (the message says to try again)."""

    message = (
        "Sluice cannot search its documents right now (the retrieval model is not answering), "
        "so your question was not sent. Please try again in a minute."
    )

    def __init__(self, reason: str = "") -> None:
        super().__init__(self.message)
        self.reason = reason


# What the person is told (on the page, and in the REST API's response and events) when their
# question goes on without passages because retrieval could not run.
RETRIEVAL_UNAVAILABLE_NOTICE = (
    "Retrieval is unavailable right now; answering without your documents' passages."
)


@dataclass
class Retrieval:
    """The passages for a question, and whether corpora would have been searched but could
    not be (then the answer goes on without them, and the person is told: `notice`)."""

    passages: list[Passage] = field(default_factory=list)
    unavailable: bool = False

    @property
    def notice(self) -> str:
        return RETRIEVAL_UNAVAILABLE_NOTICE if self.unavailable else ""


def retrieve_for_prompt(**options) -> list[Passage]:
    """The passages of `retrieval_for_prompt` (same arguments), for callers that need not
    know why there are none."""
    return retrieval_for_prompt(**options).passages


def retrieval_for_prompt(
    *,
    user,
    query: str,
    k: int | None = None,
    corpora: Iterable[Corpus | int | str] | None = None,
    metadata_filter: dict | None = None,
    boost: dict | None = None,
    budget_tokens: int | None = None,
) -> Retrieval:
    """The best `k` (default settings.RAG_TOP_K) passages for `query` from the corpora `user`
    may use (optionally narrowed to `corpora`: ids, names or Corpus objects), cut to
    `budget_tokens` (default settings.RAG_PROMPT_TOKENS). Empty when nothing passes the
    corpora's relevance gates.

    When the question's embedding cannot be had (the workers serving the model are down or
    late: apps/rag/fleet.py), RAG_EMBEDDING_UNAVAILABLE decides: "answer" returns no passages,
    marked `unavailable` (the answer goes on without them, and says so), "refuse" raises
    RetrievalRefused. A user with no corpora to search never asks for an embedding, so is
    never told."""
    try:
        passages = _retrieve(
            user=user,
            query=query,
            k=k,
            corpora=corpora,
            metadata_filter=metadata_filter,
            boost=boost,
        )
    except fleet.EmbeddingUnavailable as exc:
        if settings.RAG_EMBEDDING_UNAVAILABLE == "refuse":
            fleet.UNAVAILABLE.labels("refused").inc()
            log.warning("retrieval unavailable, question refused: %s", exc)
            raise RetrievalRefused(str(exc)) from exc
        fleet.UNAVAILABLE.labels("answered_without_passages").inc()
        log.warning("retrieval unavailable, answering without passages: %s", exc)
        return Retrieval(unavailable=True)
    budget = settings.RAG_PROMPT_TOKENS if budget_tokens is None else budget_tokens
    return Retrieval(passages_within(passages, budget_tokens=budget))


def _retrieve(*, user, query, k, corpora, metadata_filter, boost) -> list[Passage]:
    k = settings.RAG_TOP_K if k is None else k
    query = (query or "").strip()
    if not query or k < 1:
        return []
    searchable = searchable_corpora_for_user(user=user)
    if corpora is not None:
        corpora = list(corpora)
        ids = {c.pk if isinstance(c, Corpus) else c for c in corpora if not isinstance(c, str)}
        names = {c for c in corpora if isinstance(c, str)}
        searchable = [c for c in searchable if c.pk in ids or c.name in names]
    if not searchable:
        return []
    candidates = candidate_pool()
    options = {"k": k, "filter": metadata_filter, "boost": boost, "candidates": candidates}
    # Settings that change the ranking: a cached result made under others is not reused.
    options["ranking"] = (
        settings.RAG_MEAN_REMOVAL,
        settings.RAG_RERANK_MODEL,
        settings.RAG_RERANK_CANDIDATES,
        [c.rerank_model or "" for c in searchable],  # each corpus's own reranker
    )
    cache_key = caches.results_key(
        corpora=[(c.pk, c.version) for c in searchable], query=query, options=options
    )
    cached = caches.results_get(cache_key)
    if cached is not None:
        return [Passage(**row) for row in cached]
    passages = retrieval.search(
        corpora=searchable,
        query=query,
        embedding=caches.query_embeddings(query, searchable),
        k=k,
        metadata_filter=metadata_filter,
        boost=boost,
        candidates=candidates,
    )
    caches.results_put(cache_key, [p.as_dict() for p in passages])
    return passages


def candidate_pool() -> int:
    """Candidates per list before fusion: the full pool normally, a small one while the
    service sheds load (degradation level 2 and up skip the expensive part of retrieval)."""
    from apps.admission.selectors import retrieval_degraded

    if retrieval_degraded():
        return settings.RAG_DEGRADED_CANDIDATES
    return settings.RAG_CANDIDATES


def corpus_get_or_create(
    *, name: str, access: str = Corpus.Access.RESTRICTED, description: str = ""
) -> tuple[Corpus, bool]:
    return Corpus.objects.get_or_create(
        name=name, defaults={"access": access, "description": description, "title": name}
    )


def corpus_set_relevance_floor(*, corpus: Corpus, floor: float | None) -> None:
    """The corpus's relevance gate (None: the default); cached results made unreachable."""
    Corpus.objects.filter(pk=corpus.pk).update(relevance_floor=floor, version=F("version") + 1)
    corpus.relevance_floor = floor


def corpus_bump_version(*, corpus: Corpus) -> None:
    """Makes every cached result of the corpus unreachable (weights or content changed)."""
    Corpus.objects.filter(pk=corpus.pk).update(version=F("version") + 1)


def corpus_ingest_paths(
    *,
    corpus: Corpus,
    paths: list[str],
    size: int | None = None,
    overlap: int | None = None,
    batch_size: int | None = None,
    force: bool = False,
    progress: bool = False,
) -> IngestReport:
    ingestor = Ingestor(
        corpus, size=size, overlap=overlap, batch_size=batch_size, force=force, progress=progress
    )
    ingestor.add_paths(paths)
    return ingestor.finish()


def corpus_ingest_uploads(*, corpus: Corpus, files) -> IngestReport:
    """Admin uploads: Django UploadedFile objects; the source is `upload/<file name>`."""
    ingestor = Ingestor(corpus)
    for upload in files:
        source = f"upload/{upload.name}"
        if upload.size > settings.RAG_UPLOAD_MAX_BYTES:
            ingestor.report.failed.append(
                (source, f"larger than {settings.RAG_UPLOAD_MAX_BYTES // (1024 * 1024)} MB")
            )
            continue
        ingestor.add_bytes(source=source, data=upload.read())
    return ingestor.finish()


def documents_reindex(*, documents: Iterable[Document], progress: bool = False) -> IngestReport:
    """Re-chunks and re-embeds stored documents (after a change of chunk size or model)."""
    documents = list(documents)
    report = IngestReport(corpus=",".join(sorted({d.corpus.name for d in documents})) or "-")
    by_corpus: dict[int, list[Document]] = {}
    for document in documents:
        by_corpus.setdefault(document.corpus_id, []).append(document)
    for group in by_corpus.values():
        ingestor = Ingestor(group[0].corpus, force=True, progress=progress)
        for document in group:
            ingestor.add_extracted(extracted_from(document))
        partial = ingestor.finish()
        report.added += partial.added
        report.replaced += partial.replaced
        report.chunks += partial.chunks
        report.failed += partial.failed
    report.seconds = time.monotonic() - report.started
    return report


def corpus_reindex(*, corpus: Corpus, progress: bool = False) -> IngestReport:
    return documents_reindex(
        documents=corpus.documents.select_related("corpus").order_by("pk"), progress=progress
    )


@transaction.atomic
def document_delete(*, document: Document) -> None:
    corpus_id = document.corpus_id
    document.delete()
    Corpus.objects.filter(pk=corpus_id).update(version=F("version") + 1)
    corpus_refresh_counts(corpus_id=corpus_id)
