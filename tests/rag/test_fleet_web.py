"""Retrieval with the embedding model on a worker (`python -m worker embed`, here on the CPU
through sentence-transformers): a web process configured so never imports torch, and a corpus
embedded through the worker ranks as the same corpus embedded in-process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from apps.rag import caches, retrieval
from apps.rag.embeddings import embed_texts
from apps.rag.models import Corpus
from apps.rag.services import corpus_ingest_paths
from tests.conftest import BASE_DIR, process_env
from tests.rag.conftest import FIXTURES
from tests.rag.embed_worker import start_embed_worker, stop_embed_worker

QUESTIONS = [
    "How many days of paid vacation do I get?",
    "Can I take unused leave into next year?",
    "Who do I tell before going on holiday?",
    "The coffee machine shows E42, what now?",
    "How do I undo a bad release of billing?",
    "Which flag turns the new billing on?",
    "When does the bird club meet?",
    "How do I report a phishing email?",
    "Where is the espresso machine descaled?",
    "What is the rollback command?",
]

# What a web process does, configured for fleet embedding: the ASGI application loaded as daphne
# loads it, then a question retrieved for a user; it prints what it found and which of the
# heavy libraries it imported.
WEB = """
import json, sys
import django
django.setup()
import chatsite.asgi  # noqa: F401
from apps.accounts.models import User
from apps.rag import caches, retrieval
from apps.rag.embeddings import embed_texts
from apps.rag.models import Corpus
from apps.rag.services import retrieve_for_prompt
user = User.objects.get(username=sys.argv[1])
given = retrieve_for_prompt(user=user, query=sys.argv[2])
corpora = list(Corpus.objects.all())
ranked = retrieval.search(corpora=corpora, query=sys.argv[2],
                          embedding=caches.query_embeddings(sys.argv[2], corpora), k=5)
heavy = sorted(m for m in ("torch", "sentence_transformers", "transformers") if m in sys.modules)
print(json.dumps({"given": [p.chunk_id for p in given], "ranked": [p.chunk_id for p in ranked],
                  "heavy": heavy}))
"""


@pytest.fixture
def embed_worker(redis_prefix):
    process = start_embed_worker(redis_prefix)
    yield process
    stop_embed_worker(process)


@pytest.mark.django_db(transaction=True)
def test_a_web_process_on_fleet_embedding_never_imports_torch(
    handbook, user, embed_worker, redis_prefix
):
    question = QUESTIONS[0]
    env = dict(process_env(redis_prefix), RAG_EMBEDDING_SERVING="fleet")
    run = subprocess.run(
        [sys.executable, "-c", WEB, user.username, question],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["heavy"] == []
    assert found["given"]  # passages reached the prompt
    local = retrieval.search(
        corpora=[handbook], query=question, embedding=caches.query_embedding(question), k=5
    )
    assert found["ranked"] == [p.chunk_id for p in local]


def _top5(corpus: Corpus, question: str) -> list[tuple[str, int]]:
    embedding = embed_texts([question])[0]  # by the worker or in-process, as configured
    passages = retrieval.search(corpora=[corpus], query=question, embedding=embedding, k=5)
    ordinals = dict(corpus.chunks.values_list("pk", "ordinal"))
    return [(p.title, ordinals[p.chunk_id]) for p in passages]


def test_a_corpus_embedded_by_the_worker_ranks_as_one_embedded_in_process(
    db, settings, embed_worker, embedding_model
):
    paths = [str(FIXTURES / "handbook")]
    local = Corpus.objects.create(name="in-process", access=Corpus.Access.EVERYONE)
    corpus_ingest_paths(corpus=local, paths=paths)
    settings.RAG_EMBEDDING_SERVING = "fleet"
    remote = Corpus.objects.create(name="by-worker", access=Corpus.Access.EVERYONE)
    report = corpus_ingest_paths(corpus=remote, paths=paths)
    assert not report.failed and report.chunks == local.chunks.count()
    same = 0
    for question in QUESTIONS:
        settings.RAG_EMBEDDING_SERVING = "fleet"
        by_worker = _top5(remote, question)
        settings.RAG_EMBEDDING_SERVING = "local"
        same += by_worker == _top5(local, question)
    assert same >= 0.95 * len(QUESTIONS)
