"""Embeddings of the benchmark's passages, computed once and kept under var/bench/rag/.

The passages are deterministic and `passages(n)` is a prefix of `passages(m)` for n < m, so one
file per text version serves every N; it grows in checkpoints, so an interrupted first run keeps
what it has embedded.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

CHECKPOINT = 5_000


def cached_embeddings(texts: list[str], *, cache_dir: Path, version: str) -> np.ndarray:
    from apps.rag.embeddings import DIMENSIONS, embed_texts

    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"embeddings-{version}.npy"
    have = np.load(path) if path.exists() else np.zeros((0, DIMENSIONS), dtype=np.float32)
    if len(have) >= len(texts):
        return have[: len(texts)]
    missing = len(texts) - len(have)
    print(
        f"embedding {missing} passages once (cached in {path}); on two cores this runs at "
        "about 90 passages/s",
        flush=True,
    )
    started = time.monotonic()
    parts = [have]
    done = len(have)
    while done < len(texts):
        batch = texts[done : done + CHECKPOINT]
        parts.append(embed_texts(batch, batch_size=128))
        done += len(batch)
        merged = np.concatenate(parts)
        parts = [merged]
        np.save(path.with_suffix(".tmp.npy"), merged)
        path.with_suffix(".tmp.npy").replace(path)
        rate = (done - len(have)) / (time.monotonic() - started)
        print(f"  {done}/{len(texts)} embedded ({rate:.0f}/s)", flush=True)
    return parts[0][: len(texts)]
