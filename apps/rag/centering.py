"""Similarity with part of the corpus's common direction taken out.

The embeddings of one corpus share a large common component: every passage of a manual points
roughly the same way, and so does every question about it. The plain cosine then favours the
passages nearest that centre (introductions, overviews, tables of settings) for almost any
question, and a question that merely names the corpus's subject ("sluice gate") looks on topic.
Taking a share `a` (settings.RAG_MEAN_REMOVAL) of the corpus's mean embedding `m` out of both
vectors before their cosine leaves more of what tells passages apart:

    cos(q - a m, c - a m) = (q.c - a q.m - a c.m + a^2 m.m) / (|q - a m| |c - a m|)

with |x - a m|^2 = 1 - 2a x.m + a^2 m.m for unit vectors. The search statement returns c.m per
candidate beside q.c, so nothing but one dot product per candidate is added to a search. On
bench/rag.py's labelled questions a = 0.5 ranked the answering passage higher than 0 or 1, and
separated on-topic from off-topic questions better (docs/retrieval.md has the figures).

A corpus of fewer than MIN_PASSAGES passages keeps the plain cosine. Each corpus's mean is
computed by PostgreSQL (`avg(embedding)`, one scan of the corpus's rows) the first time a
process searches the corpus at a given version, then kept in memory: a re-ingest bumps the
version and so brings a fresh mean.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict

import numpy as np
from django.db import connection

from apps.rag.models import Corpus
from apps.rag.vector_index import COLUMNS

MEANS_KEPT = 512  # corpora whose mean a process keeps (users' own corpora are many and small)
# A small corpus's mean is mostly its passages themselves, not what they have in common: taking
# it out would take out what each passage says (with two passages, half of each). Below this
# many passages the plain cosine applies.
MIN_PASSAGES = 50

_means: OrderedDict[tuple[int, int], np.ndarray | None] = OrderedDict()
_lock = threading.Lock()


def corpus_means(corpora: list[Corpus]) -> dict[int, np.ndarray]:
    """Each corpus's mean embedding, by corpus id; a corpus of fewer than MIN_PASSAGES
    passages has none."""
    out: dict[int, np.ndarray] = {}
    missing = []
    with _lock:
        for corpus in corpora:
            key = (corpus.pk, corpus.version)
            if key in _means:
                _means.move_to_end(key)
                if _means[key] is not None:
                    out[corpus.pk] = _means[key]
            else:
                missing.append(corpus)
    if not missing:
        return out
    # Each corpus's mean over the column its model's vectors are in (apps/rag/vector_index.py).
    parts, params = [], []
    for slot, col in enumerate(COLUMNS):
        ids = [c.pk for c in missing if c.embedding_slot == slot]
        if ids:
            parts.append(
                f"SELECT corpus_id, avg({col})::text FROM rag_chunk "
                f"WHERE corpus_id = ANY(%s) GROUP BY corpus_id HAVING count({col}) >= %s"
            )
            params += [ids, MIN_PASSAGES]
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        found = {pk: np.array(text.strip("[]").split(","), dtype=np.float32) for pk, text in cursor}
    with _lock:
        for corpus in missing:
            _means[(corpus.pk, corpus.version)] = found.get(corpus.pk)
            while len(_means) > MEANS_KEPT:
                _means.popitem(last=False)
    out.update(found)
    return out


def means_params(means: dict[int, np.ndarray]) -> dict:
    """The search statement's parameters for `means`: ids and vector literals, side by side."""
    ids = sorted(means)
    literals = ["[" + ",".join(map(repr, means[pk].tolist())) + "]" for pk in ids]
    return {"mean_ids": ids, "means": literals}


def centered(
    cosine: float, *, query_dot: float, passage_dot: float, mean_sq: float, share: float
) -> float:
    """cos(q - a m, c - a m) from q.c, q.m, c.m and m.m (q and c of unit length)."""
    if share <= 0:
        return cosine
    a = share
    numerator = cosine - a * query_dot - a * passage_dot + a * a * mean_sq
    q_norm = 1 - 2 * a * query_dot + a * a * mean_sq
    c_norm = 1 - 2 * a * passage_dot + a * a * mean_sq
    if q_norm <= 1e-9 or c_norm <= 1e-9:
        return cosine  # a vector equal to the removed share: no direction left to compare
    return numerator / math.sqrt(q_norm * c_norm)


def clear() -> None:
    """Forgets every mean (tests that rewrite a corpus's rows in place call this)."""
    with _lock:
        _means.clear()
