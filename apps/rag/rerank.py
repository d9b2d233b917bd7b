"""An optional second stage: a model that reads the question and each passage together
reorders the best passages after the gate.

The first stage scores the question and each passage apart (two embeddings, one cosine), which
is what makes it fast and what makes it miss a passage that answers in other words. A model
reading the pair together is far better at telling the answer from a neighbour, at one model
pass per pair: so it only reorders the first settings.RAG_RERANK_CANDIDATES passages that passed
the relevance gate (the gate stays the calibrated one, so turning the stage on changes the
order, never whether passages are given).

settings.RAG_RERANK_MODEL names either
- a local sentence-transformers CrossEncoder folder (for example a downloaded
  cross-encoder/ms-marco-MiniLM-L-6-v2, ~90 MB, ~2 ms a pair on a CPU core), or
- `fleet:NAME`, a reranker served by workers (`python -m worker embed --kind score
  --served-model-name NAME`: a CrossEncoder folder, vLLM's pooling runner, or an upstream's
  `/v1/rerank`); when they do not answer in time the first stage's order stands, or
- a GGUF file of an instruction-tuned language model, which scores how likely the question is
  after the passage (apps.rag.query_likelihood; the demo's bundled SmolLM2-135M works, at about
  0.45 s a pair on two CPU cores).
Empty, the stage is off, as it is by default: no installed package ships cross-encoder weights,
and the bundled model on the demo's two cores would take seconds from every first token.

A corpus may name its own (Corpus.rerank_model, one of the above or "off"), used for its
passages instead of the setting.
"""

from __future__ import annotations

import logging
import os
import threading

from django.conf import settings

from apps.rag import fleet

log = logging.getLogger("sluice.rag.rerank")

_lock = threading.Lock()
_models: dict[str, object] = {}


class CrossEncoderScorer:
    def __init__(self, path: str):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import CrossEncoder

        if not os.path.isdir(path):
            raise FileNotFoundError(f"RAG_RERANK_MODEL: no model folder at {path}")
        self.model = CrossEncoder(path, device="cpu")

    def score(self, question: str, passages: list[str]) -> list[float]:
        pairs = [(question, passage) for passage in passages]
        return [float(s) for s in self.model.predict(pairs, show_progress_bar=False)]


class FleetScorer:
    """A reranker on the workers (apps/rag/fleet.py), asked once per question."""

    def __init__(self, model: str) -> None:
        self.model = model

    def score(self, question: str, passages: list[str]) -> list[float]:
        return fleet.score(question, passages, model=self.model)


def get_reranker(path: str):
    """The scorer at `path` (a CrossEncoder folder or a GGUF file), loaded once per process
    (never from a hub: a missing model fails loudly)."""
    model = _models.get(path)
    if model is None:
        with _lock:
            model = _models.get(path)
            if model is None:
                if path.startswith("fleet:"):
                    model = FleetScorer(path.removeprefix("fleet:"))
                elif path.endswith(".gguf"):
                    from apps.rag.query_likelihood import QueryLikelihood

                    model = QueryLikelihood(path)
                else:
                    model = CrossEncoderScorer(path)
                _models[path] = model
    return model


def passage_input(row: dict) -> str:
    # The section heading says what a passage is about when its own words do not repeat it.
    return f"{row['heading']}\n{row['text']}" if row.get("heading") else row["text"]


def reranker_for(corpus) -> str:
    """The reranker of `corpus`'s passages: its own, none for "off", else RAG_RERANK_MODEL."""
    own = (corpus.rerank_model or "").strip()
    return "" if own == "off" else own or settings.RAG_RERANK_MODEL


def reorder_by_corpus(query: str, ranked: list, *, by_corpus: dict, pool: int | None = None):
    """`ranked` with its first `pool` entries reordered, each by its corpus's reranker. One
    reranker for all: one call, as `reorder`. Several: scores of different models do not
    compare, so each reranker's passages are reordered among the places they held, and the
    first stage's interleaving of corpora stands."""
    pool = settings.RAG_RERANK_CANDIDATES if pool is None else pool
    head = list(ranked[:pool])
    paths = [reranker_for(by_corpus[s.row["corpus_id"]]) for s in head]
    if len(set(paths)) <= 1:
        return reorder(query, ranked, model_path=paths[0] if paths else "", pool=pool)
    for path in set(paths) - {""}:
        places = [i for i, p in enumerate(paths) if p == path]
        group = reorder(query, [head[i] for i in places], model_path=path, pool=len(places))
        for i, s in zip(places, group, strict=True):
            head[i] = s
    return head + ranked[pool:]


def reorder(query: str, ranked: list, *, model_path: str | None = None, pool: int | None = None):
    """`ranked` (best first) with its first `pool` entries in the model's order, each given its
    score in `.rerank`; the rest follow unchanged."""
    path = settings.RAG_RERANK_MODEL if model_path is None else model_path
    pool = settings.RAG_RERANK_CANDIDATES if pool is None else pool
    head, rest = ranked[:pool], ranked[pool:]
    if not path or len(head) < 2:
        return ranked
    try:
        scores = get_reranker(path).score(query, [passage_input(s.row) for s in head])
    except fleet.EmbeddingUnavailable as exc:  # the order without it is still a good one
        log.warning("reranker unavailable, first-stage order kept: %s", exc)
        return ranked
    for s, score in zip(head, scores, strict=True):
        s.rerank = score
    # Stable: equal model scores keep the first stage's order.
    head = sorted(head, key=lambda s: -s.rerank)
    return head + rest
