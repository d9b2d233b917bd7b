"""Similarity with the corpus's mean partly removed: the arithmetic, the mean PostgreSQL keeps
per corpus, and the scores the search hands out."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from apps.rag import caches, centering, retrieval
from apps.rag.models import Chunk
from apps.rag.services import corpus_bump_version


def _unit(rng: np.random.Generator, n: int = 16) -> np.ndarray:
    v = rng.normal(size=n)
    return v / np.linalg.norm(v)


@given(seed=st.integers(0, 2**32 - 1), share=st.floats(0.0, 1.0))
def test_centred_cosine_is_the_cosine_of_the_shifted_vectors(seed, share):
    rng = np.random.default_rng(seed)
    q, c = _unit(rng), _unit(rng)
    # A corpus's mean is shorter than one: its passages point roughly, not exactly, one way.
    m = _unit(rng) * rng.uniform(0.1, 0.9)
    qs, cs = q - share * m, c - share * m
    expected = float(qs @ cs / (np.linalg.norm(qs) * np.linalg.norm(cs)))
    got = centering.centered(
        float(q @ c),
        query_dot=float(q @ m),
        passage_dot=float(c @ m),
        mean_sq=float(m @ m),
        share=share,
    )
    assert got == pytest.approx(expected, abs=1e-9)


def _embeddings(corpus) -> dict[int, np.ndarray]:
    return {
        c.pk: np.asarray(c.embedding, dtype=np.float64) for c in Chunk.objects.filter(corpus=corpus)
    }


ANIMALS = ("fox", "heron", "otter", "badger", "owl", "trout")
PLACES = ("the marsh", "the old mill", "the river bend", "the beech wood", "the quarry")


@pytest.fixture
def field_notes(make_corpus, tmp_path):
    """A corpus of 60 short passages (one chunk each): past centering.MIN_PASSAGES."""
    rows = [
        {
            "id": f"note-{i}",
            "title": f"Field note {i}",
            "text": f"The {ANIMALS[i % 6]} was seen near {PLACES[i % 5]} on day {i} of the survey.",
        }
        for i in range(60)
    ]
    path = tmp_path / "notes.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    corpus = make_corpus("field-notes", paths=[path])
    assert corpus.chunk_count >= centering.MIN_PASSAGES
    centering.clear()
    return corpus


def test_the_corpus_mean_is_the_average_of_its_passages_and_follows_its_version(field_notes):
    vectors = _embeddings(field_notes)
    mean = centering.corpus_means([field_notes])[field_notes.pk]
    assert np.allclose(mean, np.mean(list(vectors.values()), axis=0), atol=1e-5)
    # A change of content bumps the version: the next search reads a fresh mean.
    Chunk.objects.filter(pk=min(vectors)).delete()
    assert np.allclose(centering.corpus_means([field_notes])[field_notes.pk], mean)
    corpus_bump_version(corpus=field_notes)
    field_notes.refresh_from_db()
    del vectors[min(vectors)]
    fresh = centering.corpus_means([field_notes])[field_notes.pk]
    assert np.allclose(fresh, np.mean(list(vectors.values()), axis=0), atol=1e-5)


def _search_scores(corpus, query: str, share: float | None) -> None:
    """Asserts the search's vector scores are cos(q - a m, c - a m), with a = `share`, or the
    plain cosine when `share` is None."""
    vectors = _embeddings(corpus)
    mean = np.mean(list(vectors.values()), axis=0)
    a = share or 0.0
    q = caches.query_embedding(query).astype(np.float64)
    passages = retrieval.search(corpora=[corpus], query=query, embedding=q, k=5, min_similarity=-1)
    assert len(passages) == 5
    for p in passages:
        qs, cs = q - a * mean, vectors[p.chunk_id] - a * mean
        expected = qs @ cs / (np.linalg.norm(qs) * np.linalg.norm(cs))
        # Passages pointing away from the question score 0, not below.
        assert p.vector_score == pytest.approx(max(0.0, expected), abs=1e-4)
    # The vector list's ranks are those of the scores above.
    by_score = sorted(passages, key=lambda p: -p.vector_score)
    assert [p.vector_rank for p in by_score] == sorted(p.vector_rank for p in passages)


@pytest.mark.parametrize("share", [0.0, 0.5])
def test_the_search_scores_passages_with_the_configured_share_removed(field_notes, settings, share):
    settings.RAG_MEAN_REMOVAL = share
    _search_scores(field_notes, "Where was the otter seen?", share)


def test_a_small_corpus_keeps_the_plain_cosine(handbook, settings):
    # Its mean would be mostly its own few passages: removing it would remove what they say.
    settings.RAG_MEAN_REMOVAL = 0.5
    centering.clear()
    assert handbook.chunk_count < centering.MIN_PASSAGES
    assert centering.corpus_means([handbook]) == {}
    _search_scores(handbook, "How many days of paid vacation do I get?", None)
