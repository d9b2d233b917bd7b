"""Retrieval fixtures: the real MiniLM model (loaded once per test session) and a small
corpus ingested from tests/rag/fixtures/handbook through the real pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.rag.embeddings import get_model
from apps.rag.models import Corpus
from apps.rag.services import corpus_ingest_paths

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def embedding_model():
    return get_model()


@pytest.fixture
def make_corpus(db, embedding_model):
    def make(name: str, *, access: str = Corpus.Access.EVERYONE, paths=(), **fields) -> Corpus:
        corpus = Corpus.objects.create(name=name, access=access, **fields)
        if paths:
            report = corpus_ingest_paths(corpus=corpus, paths=[str(p) for p in paths])
            assert not report.failed, report.lines()
        corpus.refresh_from_db()
        return corpus

    return make


@pytest.fixture
def handbook(make_corpus) -> Corpus:
    return make_corpus("handbook", paths=[FIXTURES / "handbook"])
