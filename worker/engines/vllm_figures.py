"""vLLM's scheduler figures for the heartbeat: KV-cache usage, running and waiting sequences,
prefix-cache hits, from a stat logger that vLLM calls after every engine step (vllm.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


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


def stat_logger_factory(figures: EngineFigures):
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
