"""When the HNSW index returns too few rows of the corpora searched (they are a small part of
the table), retrieval scans those corpora exactly: that second statement must run, and find
their passages."""

from __future__ import annotations

from apps.rag import caches, retrieval
from apps.rag.models import Corpus
from tests.rag.conftest import FIXTURES


def test_the_exact_scan_finds_a_small_corpus_passages(make_corpus, monkeypatch):
    handbook = make_corpus("handbook", paths=[FIXTURES / "handbook"])
    make_corpus("birds", paths=[FIXTURES / "handbook" / "birds.txt"])
    assert Corpus.objects.filter(chunk_count__gt=0).count() == 2
    runs = []
    real_run = retrieval._run

    def recorded(*args, exact: bool, **kwargs):
        runs.append(exact)
        return real_run(*args, exact=exact, **kwargs)

    monkeypatch.setattr(retrieval, "_run", recorded)
    # More passages than the index gives back for it: the scan follows.
    handbook.chunk_count = 10_000
    query = "How many days of paid vacation do I get?"
    passages = retrieval.search(
        corpora=[handbook], query=query, embedding=caches.query_embedding(query), k=3
    )
    assert runs == [False, True]
    assert passages and passages[0].title.startswith("Vacation policy")
