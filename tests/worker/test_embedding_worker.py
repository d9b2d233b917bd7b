"""`python -m worker embed` in a real process, serving the bundled all-MiniLM-L6-v2 over Redis,
and the web's side of it (apps/rag/fleet.py): the same vectors as in-process, many people's
questions embedded in one batch, deadlines, and a model that no worker serves."""

from __future__ import annotations

import json
import signal
import threading
import time

import numpy as np
import pytest

from apps.rag import fleet
from apps.rag.embeddings import embed_texts, get_model
from core.redis_client import get_redis, keys
from tests.conftest import wait_until
from tests.rag.embed_worker import start_embed_worker, stop_embed_worker

MODEL = "all-MiniLM-L6-v2"


@pytest.fixture
def embed_worker(redis_prefix, settings):
    """One embedding worker on the test's keys; the web side sends it the default model's work."""
    settings.RAG_EMBEDDING_SERVING = "fleet"
    settings.RAG_FLEET_STALE_SECONDS = 30  # a paused worker stays "alive" for these tests
    process = start_embed_worker(redis_prefix)
    yield process
    stop_embed_worker(process)


def _beat() -> dict:
    return json.loads(get_redis().get(keys().embedder("e1")) or "{}")


def test_the_worker_gives_the_vectors_the_web_would_compute_itself(embed_worker):
    texts = ["How do I add a GPU worker?", "Was kostet das?", "x" * 3000]
    remote = embed_texts(texts)  # RAG_EMBEDDING_SERVING=fleet: through the worker
    local = get_model().encode(texts, normalize_embeddings=True, show_progress_bar=False)
    assert remote.shape == (3, 384) and remote.dtype == np.float32
    np.testing.assert_allclose(remote, local, atol=1e-5)


def test_questions_sent_together_are_embedded_in_one_batch(embed_worker):
    embed_texts(["warm"])
    before = wait_until(lambda: _beat().get("texts") and _beat(), what="a beat after the warm-up")
    embed_worker.send_signal(signal.SIGSTOP)  # the questions gather while it is busy elsewhere
    answers: dict[int, np.ndarray] = {}

    def ask(i: int) -> None:
        answers[i] = fleet.request(model=MODEL, texts=[f"question number {i}"], timeout=60).vectors

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    wait_until(lambda: get_redis().xlen(keys().embed_work(MODEL)) == 20, what="20 requests queued")
    embed_worker.send_signal(signal.SIGCONT)
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(answers) == list(range(20))
    expected = get_model().encode(
        [f"question number {i}" for i in range(20)],
        normalize_embeddings=True,
        show_progress_bar=False,
    )
    np.testing.assert_allclose(np.vstack([answers[i] for i in range(20)]), expected, atol=1e-5)
    after = wait_until(
        lambda: (b := _beat()).get("texts", 0) >= before["texts"] + 20 and b, what="a new beat"
    )
    # Twenty people, at most two model calls: a read already waiting when the first question
    # arrived is handed that one alone; the other nineteen go in the next batch.
    assert after["batches"] - before["batches"] <= 2
    assert get_redis().xlen(keys().embed_work(MODEL)) == 0  # acknowledged and removed


def test_a_question_past_its_deadline_fails_and_the_worker_skips_it(embed_worker):
    embed_texts(["warm"])
    texts_before = wait_until(lambda: _beat().get("texts"), what="a beat after the warm-up")
    embed_worker.send_signal(signal.SIGSTOP)
    with pytest.raises(fleet.EmbeddingUnavailable, match=r"did not answer within 0\.5 s"):
        fleet.request(model=MODEL, texts=["too late"], timeout=0.5)
    embed_worker.send_signal(signal.SIGCONT)
    wait_until(lambda: get_redis().xlen(keys().embed_work(MODEL)) == 0, what="the entry dropped")
    time.sleep(1)  # a beat or three
    assert _beat()["texts"] == texts_before  # dropped unanswered: no model time spent on it


def test_a_request_is_expired_from_its_deadline_on():
    """The caller stops waiting at the deadline it wrote: a worker that reads the request in
    that same millisecond skips it."""
    from contract.embed_protocol import EmbedRequest

    request = EmbedRequest(texts=["x"], reply_to="r", deadline_ms=1_000)
    assert not request.expired(at_ms=999)
    assert request.expired(at_ms=1_000) and request.expired(at_ms=1_001)


def test_a_model_no_worker_serves_fails_at_once(db, settings):
    settings.RAG_EMBEDDING_SERVING = "fleet"
    with pytest.raises(fleet.EmbeddingUnavailable, match="no worker serves"):
        fleet.request(model="bge-large-en-v1.5", texts=["anything"], timeout=30)
    with pytest.raises(fleet.EmbeddingUnavailable, match="no worker serves"):
        embed_texts(["the default model, on the fleet, with no worker"])


def test_a_worker_stuck_after_sigterm_is_cancelled_after_the_grace(monkeypatch):
    """A read or model call that hangs must not keep a stopped worker alive: SIGTERM asks it to
    stop, and what it awaits is cancelled STOP_GRACE_SECONDS later."""
    import asyncio
    import os
    from types import SimpleNamespace

    from worker import embed_main

    monkeypatch.setattr(embed_main, "STOP_GRACE_SECONDS", 0.2)
    asked = []
    worker = SimpleNamespace(worker_id="e1", stopping=False)
    worker.stop = lambda: asked.append("stop") or setattr(worker, "stopping", True)

    async def stuck() -> str:
        embed_main._stop_on_signals(worker)
        os.kill(os.getpid(), signal.SIGTERM)
        try:
            await asyncio.sleep(30)  # a call that does not return
        except asyncio.CancelledError:
            return "cancelled"
        return "slept"

    assert asyncio.run(stuck()) == "cancelled"
    assert asked == ["stop"]
