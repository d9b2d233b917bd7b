"""Caches on the retrieval path.

- Query embeddings: an LRU in this process (functools.lru_cache, RAG_QUERY_CACHE_SIZE vectors),
  then Redis (shared by every web process) with a TTL. Embedding a query costs ~15 ms of CPU; a
  repeated question costs a dictionary lookup. A (model, question) pair always has the same
  vector, so no process needs telling of another's: the least recently used leave when full.
- Results: per (the searched corpora and their versions, the query, k, filters), in Redis with a
  TTL. Every change to a corpus bumps its version, so a re-ingest makes every cached result of
  that corpus unreachable at once (they then expire on their TTL).
A Redis outage degrades to no caching, never to no retrieval.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging

import numpy as np
import redis
from django.conf import settings

from apps.rag.embeddings import default_model_name, embed_texts
from core.redis_client import get_redis, keys

logger = logging.getLogger(__name__)


def normalize_query(text: str) -> str:
    # The model reads at most 256 word pieces; past ~2000 characters nothing changes the vector.
    return " ".join(text.split())[:2000]


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


def query_embedding(text: str, *, model: str | None = None) -> np.ndarray:
    """The question's vector from `model` (default RAG_EMBEDDING_MODEL), wherever it runs
    (apps/rag/embeddings.py). Raises fleet.EmbeddingUnavailable when its workers do not
    answer in time (nothing is cached then)."""
    return _in_process()(model or default_model_name(), normalize_query(text))


@functools.cache
def _in_process():
    """The process's LRU in front of `_shared_or_embedded`, sized when first used."""
    return functools.lru_cache(maxsize=settings.RAG_QUERY_CACHE_SIZE)(_shared_or_embedded)


def _shared_or_embedded(model: str, query: str) -> np.ndarray:
    """The vector from Redis, else embedded now and kept there."""
    redis_key = keys().rag_cache("qemb", _digest(model, query))
    try:
        stored = get_redis().get(redis_key)
        if stored:
            vector = np.frombuffer(base64.b64decode(stored), dtype=np.float32)
            if vector.ndim == 1 and vector.size:
                return vector
    except redis.RedisError as error:
        logger.warning("query-embedding cache unavailable: %s", error)
    vector = embed_texts([query], model=model)[0]
    try:
        get_redis().set(
            redis_key,
            base64.b64encode(vector.astype(np.float32).tobytes()).decode(),
            ex=settings.RAG_QUERY_CACHE_TTL,
        )
    except redis.RedisError as error:
        logger.warning("query-embedding cache unavailable: %s", error)
    return vector


def query_embeddings(text: str, corpora) -> dict[str, np.ndarray]:
    """The question's vector from each model the `corpora` are embedded with."""
    models = dict.fromkeys(c.embedding_model for c in corpora)
    return {model: query_embedding(text, model=model) for model in models}


def clear_local() -> None:
    """Forgets this process's vectors (a fresh process's view; Redis keeps its own)."""
    _in_process.cache_clear()


def results_key(*, corpora: list[tuple[int, int]], query: str, options: dict) -> str:
    """`corpora`: (id, version) pairs; a changed corpus changes the key."""
    versions = ",".join(f"{cid}@{version}" for cid, version in sorted(corpora))
    payload = json.dumps(options, sort_keys=True, default=str)
    return keys().rag_cache("res", _digest(versions, normalize_query(query), payload))


def results_get(cache_key: str) -> list[dict] | None:
    try:
        stored = get_redis().get(cache_key)
    except redis.RedisError as error:
        logger.warning("retrieval cache unavailable: %s", error)
        return None
    return json.loads(stored) if stored else None


def results_put(cache_key: str, rows: list[dict]) -> None:
    try:
        get_redis().set(cache_key, json.dumps(rows), ex=settings.RAG_RESULT_CACHE_TTL)
    except redis.RedisError as error:
        logger.warning("retrieval cache unavailable: %s", error)
