"""Engines by name. Each is imported only when chosen: vLLM and llama.cpp are heavy."""

from __future__ import annotations

import importlib
from typing import Any

from worker.engines.base import Engine, EngineHealth, EngineOutput, EngineRequest

ENGINES = {
    "llamacpp": "worker.engines.llamacpp:LlamaCppEngine",
    "vllm": "worker.engines.vllm:VLLMEngine",
    "openai": "worker.engines.openai:OpenAIEngine",
    "simulated": "worker.engines.simulated:SimulatedEngine",
}

__all__ = [
    "ENGINES",
    "Engine",
    "EngineHealth",
    "EngineOutput",
    "EngineRequest",
    "create_engine",
]


def create_engine(name: str, **options: Any) -> Engine:
    """`options` are the engine's keyword-only constructor arguments."""
    try:
        module_name, class_name = ENGINES[name].split(":")
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}") from None
    engine_class = getattr(importlib.import_module(module_name), class_name)
    return engine_class(**options)
