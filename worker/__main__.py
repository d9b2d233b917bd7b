"""`python -m worker --engine llamacpp --slots 2` runs one worker.

Every option also reads an environment variable (shown in --help), so a container or a systemd
unit can configure a worker without a command line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import logging
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import uvloop

from contract import logs
from contract.gc_tuning import freeze_startup_objects
from contract.protocol import Keys
from worker import breaker, metrics, redis_connection
from worker.engines import ENGINES, Engine, create_engine, simulated
from worker.fleet_options import add_fleet_options
from worker.runner import Worker, default_worker_id

log = logging.getLogger("sluice.worker")


def env_default(name: str, default: Any = None) -> Any:
    return os.environ.get(name, default)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m worker", description=__doc__)
    add = parser.add_argument
    add(
        "--engine",
        choices=sorted(ENGINES),
        default=env_default("WORKER_ENGINE", "llamacpp"),
        help="[WORKER_ENGINE] which engine runs the model (default llamacpp)",
    )
    add(
        "--slots",
        type=int,
        default=env_default("WORKER_SLOTS"),
        help="[WORKER_SLOTS] concurrent answers (default: the engine's capacity)",
    )
    add_fleet_options(parser)
    add(
        "--grace",
        type=float,
        default=float(env_default("WORKER_GRACE_SECONDS", 30)),
        help="[WORKER_GRACE_SECONDS] on SIGTERM, seconds running answers get to finish",
    )
    add(
        "--max-attempts",
        type=int,
        default=int(env_default("WORKER_MAX_ATTEMPTS", 3)),
        help="[WORKER_MAX_ATTEMPTS] a request started this often (its workers kept dying) goes "
        "to the dead-letter stream and fails visibly",
    )
    add(
        "--answer-timeout",
        type=float,
        default=float(env_default("WORKER_ANSWER_TIMEOUT_SECONDS", 600)),
        help="[WORKER_ANSWER_TIMEOUT_SECONDS] an answer taking longer fails and frees its slot",
    )
    add(
        "--batch-ms",
        type=float,
        default=float(env_default("WORKER_BATCH_MS", 60)),
        help="[WORKER_BATCH_MS] an answer's text is written to its stream this often, in "
        "milliseconds (the first token at once): larger batches, fewer frames to relay",
    )
    add(
        "--batch-ms-busy",
        type=float,
        default=float(env_default("WORKER_BATCH_MS_BUSY", 150)),
        help="[WORKER_BATCH_MS_BUSY] ... and this often with 64 or more answers running (in "
        "between, in step with the answers running): under load, fewer frames per answer for "
        "Redis, the web process and the browser to handle",
    )
    add(
        "--model",
        default=env_default("WORKER_MODEL"),
        help="[WORKER_MODEL] model path or id (llamacpp: a GGUF; default the bundled SmolLM2)",
    )
    add(
        "--stop-loops",
        choices=("auto", "on", "off"),
        default=env_default("WORKER_STOP_LOOPS", "auto"),
        help="[WORKER_STOP_LOOPS] stop an answer that repeats itself and say so (finish reason "
        "`loop`); auto: on only for the bundled demo model, which loops (default auto)",
    )
    add(
        "--prompt-window",
        type=int,
        default=int(env_default("WORKER_PROMPT_WINDOW") or 0) or None,
        help="[WORKER_PROMPT_WINDOW] build prompts for this worker's model within this many "
        "tokens, below the engine's own window (the heartbeat reports the smaller; default: "
        "the engine's window)",
    )
    add(
        "--served-model-name",
        default=env_default("WORKER_SERVED_MODEL_NAME"),
        help="[WORKER_SERVED_MODEL_NAME] the name clients ask for this model by (the API's "
        "`model`, the chat page's picker); workers with the same name share its work. Default: "
        "from the model file or id, e.g. smollm2-135m-instruct",
    )

    llama = parser.add_argument_group("llamacpp")
    llama.add_argument(
        "--n-ctx",
        type=int,
        default=int(env_default("LLAMACPP_N_CTX", 2048)),
        help="[LLAMACPP_N_CTX] context window in tokens",
    )
    llama.add_argument(
        "--repeat-penalty",
        type=float,
        default=float(env_default("LLAMACPP_REPEAT_PENALTY", 1.1)),
        help="[LLAMACPP_REPEAT_PENALTY] penalty on recently used tokens; 1.0 is none "
        "(default 1.1: the small demo model loops without it)",
    )

    vllm = parser.add_argument_group(
        "vllm",
        "--model: an HF model folder or hub id (default var/models/SmolLM2-135M-Instruct, "
        "made by `python -m worker prepare-model`)",
    )
    vllm.add_argument(
        "--max-model-len",
        type=int,
        default=int(env_default("WORKER_VLLM_MAX_MODEL_LEN", 0)) or None,
        help="[WORKER_VLLM_MAX_MODEL_LEN] context window in tokens (default: the model's)",
    )
    vllm.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=float(env_default("WORKER_VLLM_GPU_MEMORY_UTILIZATION", 0.9)),
        help="[WORKER_VLLM_GPU_MEMORY_UTILIZATION] share of GPU memory vLLM takes (default 0.9)",
    )
    vllm.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=int(env_default("WORKER_VLLM_TENSOR_PARALLEL_SIZE", 1)),
        help="[WORKER_VLLM_TENSOR_PARALLEL_SIZE] GPUs one model is split across (default 1)",
    )
    vllm.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=env_default("WORKER_VLLM_ENFORCE_EAGER", "0").lower() in {"1", "true", "yes"},
        help="[WORKER_VLLM_ENFORCE_EAGER] no CUDA graphs / torch.compile: starts faster, "
        "decodes slower (default off)",
    )
    vllm.add_argument(
        "--max-num-seqs",
        type=int,
        default=int(env_default("WORKER_VLLM_MAX_NUM_SEQS", 0)) or None,
        help="[WORKER_VLLM_MAX_NUM_SEQS] sequences run at once, the worker's slots "
        "(default: --slots, else vLLM's default on GPUs, 8 on the CPU)",
    )
    vllm.add_argument(
        "--dtype",
        default=env_default("WORKER_VLLM_DTYPE", "auto"),
        help="[WORKER_VLLM_DTYPE] auto, bfloat16, float16 or float32 (default auto: the model's)",
    )
    vllm.add_argument(
        "--kv-cache-gib",
        type=float,
        default=float(env_default("WORKER_VLLM_KV_CACHE_GIB", 0)) or None,
        help="[WORKER_VLLM_KV_CACHE_GIB] KV-cache size, instead of sizing it from "
        "--gpu-memory-utilization (vLLM's CPU build: 4 GiB unless set)",
    )
    vllm.add_argument(
        "--vllm-engine-args",
        default=env_default("WORKER_VLLM_ENGINE_ARGS", ""),
        help="[WORKER_VLLM_ENGINE_ARGS] other vLLM AsyncEngineArgs as JSON, "
        """e.g. '{"quantization": "fp8", "kv_cache_dtype": "fp8"}'""",
    )
    vllm.add_argument(
        "--tool-call-parser",
        default=env_default("WORKER_VLLM_TOOL_CALL_PARSER") or None,
        help="[WORKER_VLLM_TOOL_CALL_PARSER] the vLLM tool parser for the model's calls, as "
        "`vllm serve --tool-call-parser` (hermes, llama3_json, mistral, ...); unset: no tools",
    )

    simulated.add_arguments(parser)
    breaker.add_arguments(parser)

    upstream = parser.add_argument_group("openai")
    upstream.add_argument(
        "--base-url",
        default=env_default("OPENAI_BASE_URL"),
        help="[OPENAI_BASE_URL] e.g. http://gpu-box:8000/v1",
    )
    upstream.add_argument(
        "--api-key", default=env_default("OPENAI_API_KEY", ""), help="[OPENAI_API_KEY]"
    )
    upstream.add_argument(
        "--context-tokens",
        type=int,
        default=int(env_default("OPENAI_CONTEXT_TOKENS") or 0) or None,
        help="[OPENAI_CONTEXT_TOKENS] the upstream model's context window in tokens, reported "
        "in the heartbeat so the web builds prompts that fit it (default: none reported; the "
        "web then uses MODEL_CONTEXT_TOKENS). llamacpp and vllm report theirs themselves",
    )
    upstream.add_argument(
        "--image-input",
        action=argparse.BooleanOptionalAction,
        default=env_default("OPENAI_IMAGE_INPUT", "0").lower() in {"1", "true", "yes"},
        help="[OPENAI_IMAGE_INPUT] the upstream model reads images: image parts are passed on "
        "(default off: refused with a 400, as an upstream cannot say what its model reads)",
    )
    return parser


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The chosen engine's constructor arguments, from the command line."""
    slots = int(args.slots) if args.slots else None
    if args.engine == "llamacpp":
        return {
            "model_path": args.model,
            "slots": slots or 2,
            "n_ctx": args.n_ctx,
            "repeat_penalty": args.repeat_penalty,
        }
    if args.engine == "simulated":
        return simulated.options_from_args(args, slots)
    if args.engine == "openai":
        if not args.base_url or not args.model:
            raise SystemExit("--engine openai needs --base-url and --model")
        return {
            "base_url": args.base_url,
            "model": args.model,
            "api_key": args.api_key,
            "slots": slots or 16,
            "context_tokens": args.context_tokens,
            "image_input": args.image_input,
        }
    if args.engine == "vllm":
        from worker.engines.vllm import options_from_args

        return options_from_args(args)
    raise SystemExit(f"unknown engine {args.engine}")


def stop_loops(args: argparse.Namespace) -> bool:
    """Whether the worker cuts answers that repeat themselves. Sluice never changes what a model
    wrote unless the operator asked: `auto` asks only for the bundled SmolLM2 on llama.cpp, a
    135M model that falls into loops; any other model's repetition (a table, a list, code, an
    answer asked to repeat) is its own to write."""
    if args.stop_loops != "auto":
        return args.stop_loops == "on"
    return args.engine == "llamacpp" and not args.model


def served_model_name(args: argparse.Namespace) -> str:
    """The name this worker announces: --served-model-name, else one made from the model."""
    if args.served_model_name:
        return args.served_model_name.strip()
    if args.engine == "simulated":
        return "simulated"
    if args.engine == "openai":
        return args.model  # the upstream's own name for it
    model = args.model
    if not model and args.engine == "llamacpp":
        from worker.engines.llamacpp import bundled_model_path

        model = str(bundled_model_path())
    if not model and args.engine == "vllm":
        from worker.prepare_model import default_model_dir

        model = str(default_model_dir())
    return model_name_from(model or args.engine)


def model_name_from(model: str) -> str:
    """The file or folder name, lower case, without extension or quantisation: both
    `…/SmolLM2-135M-Instruct.Q4_1.gguf` and `HuggingFaceTB/SmolLM2-135M-Instruct` give
    `smollm2-135m-instruct`."""
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    name = name.removesuffix(".gguf")
    return QUANTISATION.sub("", name) or name


# A GGUF's quantisation suffix: .Q4_1, -Q4_K_M, .IQ3_XS, -f16, .bf16, ...
QUANTISATION = re.compile(r"[.\-_](i?q\d\w*|b?f16|f32|fp16)$")


@contextlib.asynccontextmanager
async def running_engine(name: str, options: dict[str, Any]) -> AsyncIterator[Engine]:
    engine = create_engine(name, **options)
    log.info("loading engine %s", name)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


async def serve(args: argparse.Namespace) -> None:
    client = redis_connection.connect(args.redis_url, decode_responses=True)
    try:
        async with running_engine(args.engine, engine_options(args)) as engine:
            worker = Worker(
                redis_client=client,
                engine=engine,
                keys=Keys(prefix=args.prefix),
                worker_id=args.worker_id or default_worker_id(),
                model=served_model_name(args),
                slots=int(args.slots) if args.slots else None,
                claim_idle_ms=args.claim_idle_ms,
                max_attempts=args.max_attempts,
                grace_seconds=args.grace,
                heartbeat_interval=args.heartbeat_interval,
                batch_interval=args.batch_ms / 1000,
                batch_busy_interval=args.batch_ms_busy / 1000,
                answer_timeout=args.answer_timeout,
                stop_loops=stop_loops(args),
                breaker=breaker.settings_from_args(args),
                prompt_window=args.prompt_window,
            )
            if args.metrics_port:
                metrics.serve(args.metrics_port, lambda: worker.last_beat, addr=args.metrics_addr)
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, worker.stop)
            freeze_startup_objects()  # the engine and its model loaded
            await worker.run()
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # LOG_FORMAT=json: one JSON object per line, with the request id (contract/logs.py).
    logs.configure(level=os.environ.get("LOG_LEVEL", "INFO"), process="worker")
    # `kill -USR1` prints every thread's stack to stderr: where a worker that will not stop is.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if argv[:1] == ["prepare-model"]:
        from worker.prepare_model import main as prepare_model_main

        return prepare_model_main(argv[1:])
    if argv[:1] == ["embed"]:  # a retrieval model: worker/embedding.py
        from worker.embed_main import main as embed_main

        return embed_main(argv[1:])
    args = build_parser().parse_args(argv)
    # uvloop: the worker's per-token work is event-loop work (timers, socket reads and writes).
    uvloop.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
