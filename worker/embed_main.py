"""`python -m worker embed`: its command line, and the process that runs an EmbedWorker
(worker/embedding.py) until SIGTERM or SIGINT. Each option also reads the environment variable
named in brackets in its help."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal

import uvloop

from contract.protocol import Keys
from worker import metrics, redis_connection
from worker.embedding import EmbedWorker
from worker.engines.embedders import EMBEDDERS, KINDS, POOLINGS, create_embedder
from worker.fleet_options import add_fleet_options
from worker.runner import default_worker_id

log = logging.getLogger("sluice.worker.embed")

# After SIGTERM a worker ends within one read (1 s) or one model call; past this, whatever it
# awaits is cancelled, so a hung read or call cannot keep a stopped worker alive.
STOP_GRACE_SECONDS = 10.0


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="python -m worker embed", description=__doc__)
    add = parser.add_argument
    add(
        "--engine",
        choices=sorted(EMBEDDERS),
        default=env("EMBED_ENGINE", "sentence-transformers"),
        help="[EMBED_ENGINE] what runs the model (default sentence-transformers)",
    )
    add(
        "--kind",
        choices=KINDS,
        default=env("EMBED_KIND", "embed"),
        help="[EMBED_KIND] embed (an embedding model) or score (a reranker)",
    )
    add(
        "--model",
        default=env("EMBED_MODEL"),
        help="[EMBED_MODEL] a model folder or hub id (default: the bundled all-MiniLM-L6-v2); "
        "with --engine llamacpp, a GGUF file; with --engine openai, the upstream's model name",
    )
    add(
        "--served-model-name",
        default=env("EMBED_SERVED_MODEL_NAME"),
        help="[EMBED_SERVED_MODEL_NAME] the name corpora use for it (default: all-MiniLM-L6-v2 "
        "for the bundled model, else the folder's or id's last part)",
    )
    add(
        "--device",
        default=env("EMBED_DEVICE", "cpu"),
        help="[EMBED_DEVICE] sentence-transformers: cpu or cuda",
    )
    add(
        "--max-batch",
        type=int,
        default=int(env("EMBED_MAX_BATCH", 256)),
        help="[EMBED_MAX_BATCH] texts per model call",
    )
    add(
        "--max-entries",
        type=int,
        default=int(env("EMBED_MAX_ENTRIES", 128)),
        help="[EMBED_MAX_ENTRIES] requests read at once",
    )
    add_fleet_options(parser)
    add(
        "--max-model-len",
        type=int,
        default=int(env("EMBED_MAX_MODEL_LEN", 0)) or None,
        help="[EMBED_MAX_MODEL_LEN] vllm and llamacpp: tokens read of a text (llamacpp: "
        "default 512)",
    )
    vllm = parser.add_argument_group("vllm")
    vllm.add_argument("--dtype", default=env("EMBED_DTYPE", "auto"))
    vllm.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=float(env("EMBED_GPU_MEMORY_UTILIZATION", 0.2)),
        help="[EMBED_GPU_MEMORY_UTILIZATION] share of the GPU it takes (beside a "
        "chat model: default 0.2)",
    )
    vllm.add_argument("--enforce-eager", action="store_true")
    llamacpp = parser.add_argument_group("llamacpp")
    llamacpp.add_argument(
        "--pooling",
        choices=POOLINGS,
        default=env("EMBED_POOLING", "model"),
        help="[EMBED_POOLING] token vectors to one: as the GGUF says (model; mean when it "
        "says none), mean, cls or last",
    )
    llamacpp.add_argument(
        "--threads",
        type=int,
        default=int(env("EMBED_THREADS", 0)) or None,
        help="[EMBED_THREADS] CPU threads (default: half the cores)",
    )
    upstream = parser.add_argument_group("openai")
    upstream.add_argument("--base-url", default=env("OPENAI_BASE_URL"))
    upstream.add_argument("--api-key", default=env("OPENAI_API_KEY", ""))
    return parser


def served_name(args: argparse.Namespace) -> str:
    if args.served_model_name:
        return args.served_model_name.strip()
    if not args.model:
        return "all-MiniLM-L6-v2"  # the bundled folder: the name corpora use by default
    return args.model.rstrip("/").rsplit("/", 1)[-1].removesuffix(".gguf")


async def serve(args: argparse.Namespace) -> None:
    if args.engine == "openai" and not (args.base_url and args.model):
        raise SystemExit("--engine openai needs --base-url and --model")
    embedder = create_embedder(
        args.engine, **{k: v for k, v in vars(args).items() if v is not None}
    )
    client = redis_connection.connect(args.redis_url, decode_responses=True)
    await embedder.start()
    try:
        worker = EmbedWorker(
            redis_client=client,
            embedder=embedder,
            keys=Keys(prefix=args.prefix),
            model=served_name(args),
            worker_id=args.worker_id or default_worker_id(),
            max_entries=args.max_entries,
            max_batch=args.max_batch,
            heartbeat_interval=args.heartbeat_interval,
            claim_idle_ms=args.claim_idle_ms,
        )
        if args.metrics_port:
            metrics.serve(args.metrics_port, lambda: None, addr=args.metrics_addr)
        _stop_on_signals(worker)
        await worker.run()
    finally:
        await embedder.stop()
        await client.aclose()


def _stop_on_signals(worker: EmbedWorker) -> None:
    """SIGTERM or SIGINT stops `worker` (logged, so a slow stop shows whether the signal came);
    the running task is cancelled STOP_GRACE_SECONDS later, or at once on a second signal."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def stop(signum: signal.Signals) -> None:
        if worker.stopping:
            log.warning("embedding worker %s: %s again, cancelling", worker.worker_id, signum.name)
            task.cancel()
            return
        log.info("embedding worker %s: %s, stopping", worker.worker_id, signum.name)
        worker.stop()
        loop.call_later(STOP_GRACE_SECONDS, task.cancel)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop, signum)


def main(argv: list[str]) -> int:
    uvloop.run(serve(build_parser().parse_args(argv)))
    return 0
