"""The contract of retrieval work on the fleet: what a web process asks an embedding worker
(worker/embedding.py) and what it answers. Kept beside contract/protocol.py, which holds the chat
work's; the names live in contract/keys.py (`embed_work`, `embed_replies`, `embedders`).

A request is one entry on `embed-work:{model}`: texts to embed, or a question and passages to
score. Its answer is one entry on the asking process's reply stream, which that process reads
with one blocking connection for all its threads. Entries are flat string maps; vectors travel
as little-endian float32 bytes in base64 (a 384-dimension vector is 2 KB, not 7 KB of digits).
A request past its deadline is dropped by the worker unanswered: the asker has moved on.
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass, field

import numpy as np

from contract.protocol import PROTOCOL_VERSION, READABLE_VERSIONS, now_ms

EMBED_GROUP = "embedders"  # consumer group of every embedding worker on its model's stream
EMBED_WORK_MAXLEN = 20_000  # a stream no worker reads stays bounded
REPLIES_MAXLEN = 5_000
REPLIES_TTL_SECONDS = 120
EMBED = "embed"
SCORE = "score"


@dataclass
class EmbedRequest:
    texts: list[str]
    reply_to: str
    deadline_ms: int
    op: str = EMBED
    query: str = ""  # the question, with op SCORE
    # "query": a person waits for it; "bulk": ingestion or re-embedding. A worker serves the
    # queries it has read before the bulk texts.
    purpose: str = "query"
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    v: str = PROTOCOL_VERSION

    def to_fields(self) -> dict[str, str]:
        return {
            "v": self.v,
            "id": self.id,
            "op": self.op,
            "texts": json.dumps(self.texts),
            "query": self.query,
            "purpose": self.purpose,
            "reply": self.reply_to,
            "deadline_ms": str(self.deadline_ms),
        }

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> EmbedRequest:
        if fields.get("v", "1") not in READABLE_VERSIONS:
            raise ValueError(f"unreadable protocol version {fields.get('v')!r}")
        texts = json.loads(fields["texts"])
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ValueError("texts must be a list of strings")
        op = fields.get("op", EMBED)
        if op not in (EMBED, SCORE):
            raise ValueError(f"unknown op {op!r}")
        return cls(
            id=fields["id"],
            texts=texts,
            reply_to=fields["reply"],
            deadline_ms=int(fields["deadline_ms"]),
            op=op,
            query=fields.get("query", ""),
            purpose=fields.get("purpose", "query"),
            v=fields.get("v", PROTOCOL_VERSION),
        )

    def expired(self, at_ms: int | None = None) -> bool:
        """At the deadline or after it: the caller has stopped waiting by then."""
        return (now_ms() if at_ms is None else at_ms) >= self.deadline_ms


@dataclass
class EmbedReply:
    id: str
    model: str
    vectors: np.ndarray | None = None  # rows of unit length, float32
    scores: list[float] | None = None
    error: str = ""
    worker: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    def to_fields(self) -> dict[str, str]:
        fields = {"v": PROTOCOL_VERSION, "id": self.id, "model": self.model, "worker": self.worker}
        if self.error:
            fields["error"] = self.error
        if self.vectors is not None:
            vectors = np.ascontiguousarray(self.vectors, dtype="<f4")
            fields["dims"] = str(vectors.shape[1] if vectors.ndim == 2 else 0)
            fields["vectors"] = base64.b64encode(vectors.tobytes()).decode()
        if self.scores is not None:
            fields["scores"] = json.dumps(self.scores)
        return fields

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> EmbedReply:
        vectors = None
        if "vectors" in fields:
            dims = int(fields.get("dims", "0"))
            flat = np.frombuffer(base64.b64decode(fields["vectors"]), dtype="<f4")
            vectors = flat.reshape(-1, dims).astype(np.float32) if dims else flat.reshape(0, 0)
        scores = json.loads(fields["scores"]) if "scores" in fields else None
        return cls(
            id=fields["id"],
            model=fields.get("model", ""),
            vectors=vectors,
            scores=scores,
            error=fields.get("error", ""),
            worker=fields.get("worker", ""),
        )


def unit_rows(vectors) -> np.ndarray:
    """float32 rows of unit length (cosine similarity = dot product), whatever the engine gave."""
    array = np.asarray(vectors, dtype=np.float32)
    if array.ndim == 1:
        array = array.reshape(1, -1)
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    return array / np.where(norms > 0, norms, 1.0)
