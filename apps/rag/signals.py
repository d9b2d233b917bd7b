"""A corpus's counts follow its documents wherever they are deleted (services, the admin, a
shell, a queryset): once the transaction commits, each corpus that lost documents is recounted
once, and a corpus left with no chunks is searched no more (selectors.py reads its counts).

Chunks are not watched: a receiver on Chunk would make every cascade load each chunk (and its
embedding) to signal it; the corpus's counts speak for them.
"""

from __future__ import annotations

from django.db.models.signals import post_delete

from apps.rag.ingestion import corpus_refresh_counts
from apps.rag.models import Document
from core.commits import after_commit_collect


def _document_deleted(sender, instance: Document, **kwargs) -> None:
    corpus_id = instance.corpus_id
    after_commit_collect(
        "recount",
        add=lambda batch: batch["corpora"].add(corpus_id),
        apply=_recount,
        empty=lambda: {"corpora": set()},
    )


def _recount(batch: dict) -> None:
    for corpus_id in sorted(batch["corpora"]):
        corpus_refresh_counts(corpus_id=corpus_id)


def connect() -> None:
    post_delete.connect(_document_deleted, sender=Document, dispatch_uid="corpora-doc-delete")
