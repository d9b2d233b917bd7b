"""Corpora of any dimension, each with its own HNSW index, and a change of model that re-embeds
a corpus in the background while its old vectors answer.

The second model is one this test builds: all-MiniLM-L6-v2 followed by a fixed random
projection to 128 dimensions (a sentence-transformers Dense layer, seeded) and normalisation.
It ranks passages much as MiniLM does, at another dimension, which is what these tests need.
"""

from __future__ import annotations

import numpy as np
import pytest
from django.db import connection

from apps.rag import caches, centering, reembedding, retrieval, vector_index
from apps.rag.embeddings import default_model_path
from apps.rag.models import Chunk, Corpus, Reembedding
from apps.rag.services import corpus_ingest_paths, retrieve_for_prompt
from tests.rag.conftest import FIXTURES

PROJECTED = "minilm-projected-128"
QUESTION = "How many days of paid vacation do I get?"


@pytest.fixture(scope="session")
def projected_model(tmp_path_factory, embedding_model):
    import torch
    from sentence_transformers import SentenceTransformer, models

    folder = tmp_path_factory.mktemp("models") / PROJECTED
    base = SentenceTransformer(str(default_model_path()), device="cpu")
    dense = models.Dense(
        in_features=384, out_features=128, bias=False, activation_function=torch.nn.Identity()
    )
    weights = np.random.default_rng(47).standard_normal((128, 384)).astype(np.float32)
    with torch.no_grad():
        dense.linear.weight.copy_(torch.from_numpy(weights / np.sqrt(128)))
    SentenceTransformer(modules=[*base, dense, models.Normalize()], device="cpu").save(str(folder))
    return folder


@pytest.fixture
def projected(settings, projected_model):
    settings.RAG_LOCAL_EMBEDDING_MODELS = {PROJECTED: str(projected_model)}
    settings.RAG_HNSW_MIN_CHUNKS = 1  # every corpus here gets its index
    caches.clear_local()
    centering.clear()
    return PROJECTED


def _dims_stored(corpus: Corpus, slot: int) -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT DISTINCT vector_dims({vector_index.column(slot)}) FROM rag_chunk "
            "WHERE corpus_id = %s",
            [corpus.pk],
        )
        return {row[0] for row in cursor.fetchall()}


def _index_definition(corpus: Corpus, slot: int) -> str | None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = %s",
            [vector_index.index_name(corpus.pk, slot)],
        )
        row = cursor.fetchone()
    return row[0] if row else None


def test_a_corpus_at_another_dimension_is_ingested_indexed_and_searched(db, user, projected):
    corpus = Corpus.objects.create(name="projected", access=Corpus.Access.EVERYONE)
    reembedding.corpus_model_change(corpus=corpus, model=projected)  # empty: at once
    report = corpus_ingest_paths(corpus=corpus, paths=[str(FIXTURES / "handbook")])
    assert not report.failed, report.lines()
    corpus.refresh_from_db()
    assert (corpus.embedding_model, corpus.embedding_dimensions) == (projected, 128)
    assert _dims_stored(corpus, 0) == {128}
    definition = _index_definition(corpus, 0)
    assert "hnsw" in definition and "vector(128)" in definition
    assert f"corpus_id = {corpus.pk}" in definition

    passages = retrieve_for_prompt(user=user, query=QUESTION)
    assert passages and passages[0].title.startswith("Vacation policy")
    assert {p.corpus_id for p in passages} == {corpus.pk}


def test_the_planner_walks_the_corpus_own_index(db, projected):
    corpus = Corpus.objects.create(name="projected", access=Corpus.Access.EVERYONE)
    reembedding.corpus_model_change(corpus=corpus, model=projected)
    corpus_ingest_paths(corpus=corpus, paths=[str(FIXTURES / "handbook")])
    corpus.refresh_from_db()
    vector = caches.query_embedding(QUESTION, model=projected)
    literal = "[" + ",".join(f"{x:.6f}" for x in vector) + "]"
    with connection.cursor() as cursor:
        # A handful of rows: a scan and a sort would win; without them, only an index that
        # orders by this very expression can answer.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute(
            f"EXPLAIN SELECT c.id FROM rag_chunk c WHERE c.corpus_id = {corpus.pk} "
            f"ORDER BY {vector_index.typed(corpus)} <=> %s::vector(128) LIMIT 5",
            [literal],
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert vector_index.index_name(corpus.pk, 0) in plan


def test_corpora_of_two_models_are_searched_together(db, user, handbook, projected):
    birds = Corpus.objects.create(name="birds", access=Corpus.Access.EVERYONE)
    reembedding.corpus_model_change(corpus=birds, model=projected)
    corpus_ingest_paths(corpus=birds, paths=[str(FIXTURES / "handbook" / "birds.txt")])
    passages = retrieve_for_prompt(user=user, query="When does the bird club meet?", k=10)
    assert {p.corpus_id for p in passages} >= {birds.pk}
    vacation = retrieve_for_prompt(user=user, query=QUESTION)
    assert vacation[0].corpus_id == handbook.pk


def test_a_model_change_reembeds_while_the_old_vectors_answer(
    db, user, handbook, projected, tmp_path
):
    before = retrieve_for_prompt(user=user, query=QUESTION)
    job = reembedding.corpus_model_change(corpus=handbook, model=projected)
    assert job is not None and job.state == Reembedding.State.QUEUED and job.slot == 1
    assert job.total == handbook.chunk_count

    # The new column half made: the corpus still reads its MiniLM vectors, and answers.
    job.dimensions = 128
    job.save()
    reembedding._fill(job)
    handbook.refresh_from_db()
    assert (handbook.embedding_model, handbook.embedding_slot) == ("all-MiniLM-L6-v2", 0)
    assert _dims_stored(handbook, 1) == {128}
    caches.clear_local()
    assert [p.chunk_id for p in retrieve_for_prompt(user=user, query=QUESTION)] == [
        p.chunk_id for p in before
    ]
    # A document ingested meanwhile is written with the old model; the swap embeds it anew.
    canteen = tmp_path / "canteen.md"
    canteen.write_text("# Canteen\n\nThe canteen on the third floor opens at 11:30 on weekdays.\n")
    corpus_ingest_paths(corpus=handbook, paths=[str(canteen)])
    assert Chunk.objects.filter(corpus=handbook, embedding_alt__isnull=True).exists()

    assert reembedding.reembed_pending(grace=0) == 1
    job.refresh_from_db()
    handbook.refresh_from_db()
    assert job.state == Reembedding.State.DONE, job.error
    assert job.done == job.total == Chunk.objects.filter(corpus=handbook).count()
    assert (handbook.embedding_model, handbook.embedding_dimensions) == (projected, 128)
    assert handbook.embedding_slot == 1
    assert _dims_stored(handbook, 1) == {128}
    assert _dims_stored(handbook, 0) == {None}  # the old vectors cleared after the grace
    assert "vector(128)" in _index_definition(handbook, 1)
    assert _index_definition(handbook, 0) is None
    assert all(d.pipeline.startswith(projected + "/") for d in handbook.documents.all())

    after = retrieve_for_prompt(user=user, query=QUESTION)
    assert after and after[0].title.startswith("Vacation policy")
    opening = retrieve_for_prompt(user=user, query="When does the canteen open?")
    assert "canteen" in opening[0].text.lower()


def test_a_question_vector_of_the_wrong_length_is_refused_plainly(db, handbook):
    with pytest.raises(ValueError, match="384-dimension"):
        retrieval.search(corpora=[handbook], query=QUESTION, embedding=np.ones(128))
