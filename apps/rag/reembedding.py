"""Changing a corpus's embedding model: its passages are embedded again in the background,
into the chunk column the corpus does not read (apps/rag/vector_index.py), while its old
vectors and index keep answering; once every passage has a new vector and the new index is
built, the corpus switches model, dimension and column in one update (its version bump makes
every cached result of the old model unreachable). The old column is emptied a grace period
later, so a search that read the corpus just before the switch still finds its vectors.

Passages ingested meanwhile are written with the old model (ingestion locks the corpus row and
writes the column it reads); the switch takes the same lock and first embeds any passage still
without a new vector, so none is left behind. A Reembedding row is the job and the progress the
admin shows; one per corpus at a time. Jobs run in a thread of the web process that started
them (`reembed_soon`) or in `manage.py reembed --drain`; a job whose runner died (no progress
for RAG_USER_FILE_STALE_SECONDS) is taken over and resumes where it stopped.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from apps.rag import vector_index
from apps.rag.chunk_writes import vector_literal
from apps.rag.embeddings import dimensions_of, embed_texts
from apps.rag.ingestion import embedding_input
from apps.rag.models import Chunk, Corpus, Reembedding
from core.drainers import Drainer

log = logging.getLogger("sluice.rag.reembed")


class ReembedBusy(Exception):
    """The corpus is already moving to another model."""


def corpus_model_change(*, corpus: Corpus, model: str) -> Reembedding | None:
    """Moves `corpus` to embedding model `model`: at once when it holds no passages (the model
    is asked its dimension), else by a background job, returned. Raises ReembedBusy, or
    fleet.EmbeddingUnavailable when the model's workers do not answer."""
    model = model.strip()
    if not model or model == corpus.embedding_model:
        return None
    if not Chunk.objects.filter(corpus_id=corpus.pk).exists():
        dimensions = dimensions_of(model)
        Corpus.objects.filter(pk=corpus.pk).update(
            embedding_model=model, embedding_dimensions=dimensions, version=F("version") + 1
        )
        corpus.embedding_model, corpus.embedding_dimensions = model, dimensions
        return None
    try:
        with transaction.atomic():
            job = Reembedding.objects.create(
                corpus=corpus,
                model=model,
                previous_model=corpus.embedding_model,
                slot=1 - corpus.embedding_slot,
                total=corpus.chunk_count,
            )
    except IntegrityError:
        raise ReembedBusy(f"{corpus.name} is already moving to another model") from None
    transaction.on_commit(reembed_soon)
    return job


def reembed_retry(*, job: Reembedding) -> None:
    """A failed job starts again where it stopped."""
    Reembedding.objects.filter(pk=job.pk, state=Reembedding.State.FAILED).update(
        state=Reembedding.State.QUEUED, error="", claimed_at=None
    )
    transaction.on_commit(reembed_soon)


def _claim() -> Reembedding | None:
    stale = timezone.now() - timedelta(seconds=settings.RAG_USER_FILE_STALE_SECONDS)
    with transaction.atomic():
        job = (
            Reembedding.objects.select_for_update(skip_locked=True)
            .filter(
                Q(state=Reembedding.State.QUEUED)
                | Q(state=Reembedding.State.RUNNING, claimed_at__lt=stale)
            )
            .order_by("created")
            .first()
        )
        if job is not None:
            job.state, job.claimed_at = Reembedding.State.RUNNING, timezone.now()
            job.save(update_fields=["state", "claimed_at"])
    return job


def reembed_pending(*, grace: float | None = None) -> int:
    """Runs every waiting job to its end; returns how many ran."""
    ran = 0
    while (job := _claim()) is not None:
        ran += 1
        try:
            reembed_run(job=job, grace=grace)
        except Exception as exc:  # the model away, say: the corpus keeps its old vectors
            log.exception("re-embedding %s failed", job)
            Reembedding.objects.filter(pk=job.pk).update(
                state=Reembedding.State.FAILED, error=str(exc)[:2000], finished=timezone.now()
            )
    return ran


def reembed_run(*, job: Reembedding, grace: float | None = None) -> None:
    corpus = job.corpus
    column = vector_index.column(job.slot)
    if job.done == 0:  # a fresh start: the free column may hold an older model's vectors
        vector_index.index_drop(corpus_id=corpus.pk, slot=job.slot)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE rag_chunk SET {column} = NULL WHERE corpus_id = %s "
                f"AND {column} IS NOT NULL",
                [corpus.pk],
            )
    if job.dimensions is None:
        job.dimensions = dimensions_of(job.model)
        job.save(update_fields=["dimensions"])
    _fill(job)
    vector_index.index_ensure(corpus_id=corpus.pk, slot=job.slot, dimensions=job.dimensions)
    with transaction.atomic():
        locked = Corpus.objects.select_for_update().get(pk=corpus.pk)
        _fill(job)  # passages ingested since the pass: ingestion waits on this lock now
        old_slot = locked.embedding_slot
        Corpus.objects.filter(pk=corpus.pk).update(
            embedding_model=job.model,
            embedding_dimensions=job.dimensions,
            embedding_slot=job.slot,
            version=F("version") + 1,
        )
        with connection.cursor() as cursor:  # its documents count as made by the new model
            old = locked.embedding_model
            cursor.execute(
                "UPDATE rag_document SET pipeline = %s || substr(pipeline, length(%s) + 1) "
                "WHERE corpus_id = %s AND left(pipeline, length(%s) + 1) = %s || '/'",
                [job.model, old, corpus.pk, old, old],
            )
        total = Chunk.objects.filter(corpus_id=corpus.pk).count()
        Reembedding.objects.filter(pk=job.pk).update(
            state=Reembedding.State.DONE, done=total, total=total, finished=timezone.now()
        )
    log.info("corpus %s now embedded with %s (%d dims)", corpus.name, job.model, job.dimensions)
    time.sleep(settings.RAG_REEMBED_GRACE_SECONDS if grace is None else grace)
    vector_index.index_drop(corpus_id=corpus.pk, slot=old_slot)
    with connection.cursor() as cursor:
        old = vector_index.column(old_slot)
        cursor.execute(
            f"UPDATE rag_chunk SET {old} = NULL WHERE corpus_id = %s AND {old} IS NOT NULL",
            [corpus.pk],
        )


def _fill(job: Reembedding) -> None:
    """Embeds, batch by batch, the corpus's passages that have no vector in the job's column."""
    column = vector_index.column(job.slot)
    after = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                SELECT c.id, d.title, c.heading, c.text FROM rag_chunk c
                JOIN rag_document d ON d.id = c.document_id
                WHERE c.corpus_id = %s AND c.{column} IS NULL AND c.id > %s
                ORDER BY c.id LIMIT %s
                """,
                [job.corpus_id, after, settings.RAG_REEMBED_BATCH],
            )
            rows = cursor.fetchall()
        if not rows:
            return
        inputs = [embedding_input(title=t, heading=h, text=x) for _, t, h, x in rows]
        vectors = embed_texts(inputs, model=job.model, purpose="bulk")
        if vectors.shape[1] != job.dimensions:
            raise ValueError(
                f"{job.model} gave {vectors.shape[1]} dimensions, not {job.dimensions}"
            )
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                UPDATE rag_chunk c SET {column} = t.v::vector
                FROM unnest(%s::bigint[], %s::text[]) AS t(id, v) WHERE c.id = t.id
                """,
                [[r[0] for r in rows], [vector_literal(v) for v in vectors]],
            )
        after = rows[-1][0]
        Reembedding.objects.filter(pk=job.pk).update(
            done=F("done") + len(rows), claimed_at=timezone.now()
        )


# -- the background runner: one thread per process, like users' files' --------------------------

_drainer = Drainer("sluice-reembed", reembed_pending, what="re-embedding")


def reembed_soon() -> None:
    """Makes sure this process's re-embedding thread runs (it finds the job in the table)."""
    _drainer.soon()
