"""`POST /v1/embeddings` with the embedding model Sluice ships (all-MiniLM-L6-v2, the one
retrieval uses), in OpenAI's shape: floats, or base64 (what the `openai` package asks for).

Embeddings run in the web process, not on a worker: they take no turn in the fair queue, but
they are charged to the plan's buckets like any request (kind "embedding"), so a plan's rates
hold here too.
"""

from __future__ import annotations

import base64

import numpy as np
from asgiref.sync import sync_to_async

from apps.admission.buckets import TAKEN, BucketStore, plan_buckets
from apps.admission.models import Plan
from apps.api import openai_errors as errors
from apps.api.openai_errors import ApiError
from apps.api.openai_limits import rate_limit_headers
from apps.rag import embeddings as model
from core.redis_client import get_redis, keys

KIND = "embedding"
MAX_INPUTS = 2048  # OpenAI's own limit per request
NAMES = {model.MODEL_NAME, f"sentence-transformers/{model.MODEL_NAME}"}


def inputs_of(body: dict) -> list[str]:
    for name in body:
        if name not in ("input", "model", "encoding_format", "dimensions", "user"):
            raise errors.invalid(name, f"Unrecognized request argument supplied: {name}")
    given = body.get("input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts:
        raise errors.invalid("input", "`input` must be a string or a non-empty list of strings.")
    if not all(isinstance(t, str) for t in texts):
        # Token ids name tokens of some vocabulary the request does not say (LangChain sends
        # tiktoken's cl100k_base ids; another client may send the model's own): decoding them
        # would be a guess, and a wrong guess is a wrong vector returned without a word.
        raise errors.invalid(
            "input",
            f"`input` must be text: token arrays cannot be read, since {model.MODEL_NAME} has a "
            "tokenizer of its own. Send strings; with LangChain, create "
            "OpenAIEmbeddings(..., check_embedding_ctx_length=False).",
            code="unsupported_parameter",
        )
    if any(not t for t in texts):
        raise errors.invalid("input", "`input` must not contain empty strings.")
    if len(texts) > MAX_INPUTS:
        raise errors.invalid("input", f"At most {MAX_INPUTS} inputs per request.")
    if body.get("encoding_format", "float") not in ("float", "base64", None):
        raise errors.invalid("encoding_format", "`encoding_format` must be float or base64.")
    dimensions = body.get("dimensions")
    if dimensions is not None and dimensions != model.DIMENSIONS:
        raise errors.unsupported("dimensions", f"other sizes than {model.DIMENSIONS} dimensions")
    return texts


def charge(user_id: str, plan: Plan, tokens: int) -> None:
    """The plan's buckets pay for the inputs (ApiError 429 when they cannot now)."""
    buckets = plan_buckets(plan, tokens=tokens, requests=plan.cost_weight(KIND))
    decision = BucketStore(get_redis()).take([(keys().bucket(user_id), buckets)])[0]
    if decision.code == TAKEN:
        return
    if decision.wait_ms == 0:  # larger than the plan allows at once: waiting will not help
        raise errors.invalid(
            "input",
            f"These inputs need {tokens} tokens, more than your plan allows at once.",
            code="request_too_large",
        )
    headers = rate_limit_headers(user_id, plan)
    headers["Retry-After"] = str(decision.wait_ms // 1000 + 1)
    raise ApiError(
        429,
        f"You are sending more than your plan allows. Try again in "
        f"{decision.wait_ms // 1000 + 1} s.",
        type="requests" if decision.bucket == "req" else "tokens",
        code="rate_limit_exceeded",
        headers=headers,
    )


def embed(texts: list[str], *, user_id: str, plan: Plan, encoding: str) -> dict:
    """In a thread: counts the tokens the model reads, charges them, embeds."""
    tokens = [
        min(len(e.ids), model.MAX_SEQ_TOKENS) for e in model.get_tokenizer().encode_batch(texts)
    ]
    charge(user_id, plan, sum(tokens))
    vectors = model.embed_texts(texts)
    if encoding == "base64":
        rows = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors]
    else:
        rows = np.asarray(vectors, dtype=np.float64).tolist()
    return {
        "object": "list",
        "model": model.MODEL_NAME,
        "data": [
            {"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)
        ],
        "usage": {"prompt_tokens": sum(tokens), "total_tokens": sum(tokens)},
    }


async def embeddings_create(body: dict, *, user, plan: Plan) -> dict:
    texts = inputs_of(body)
    name = body.get("model")
    if not isinstance(name, str) or name not in NAMES or not plan.allows(model.MODEL_NAME):
        raise errors.model_not_found(str(name))
    return await sync_to_async(embed, thread_sensitive=False)(
        texts, user_id=str(user.pk), plan=plan, encoding=body.get("encoding_format") or "float"
    )
