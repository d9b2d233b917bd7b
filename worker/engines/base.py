"""The interface every engine implements, and what flows through it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class GenerationRequest:
    id: str
    messages: list[dict[str, str]]  # chat messages; the engine applies the model's template
    max_tokens: int = 512
    temperature: float = 0.7
    top_p: float | None = None  # None: the engine's (or the model's) default
    stop: list[str] = field(default_factory=list)  # the answer ends before any of these


@dataclass
class EngineOutput:
    """One step of a generation: new text, and the token counts so far."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None  # "stop", "length", "abort" on the last output
    cached_tokens: int = 0  # of the prompt tokens, those found in the engine's KV cache


@dataclass
class EngineHealth:
    ok: bool
    detail: str = ""
    # Engine figures the dispatcher uses (KV-cache use, running / waiting sequences, prefix-cache
    # hit rate, ...); copied verbatim into the worker's heartbeat.
    metrics: dict[str, Any] = field(default_factory=dict)


class Engine(Protocol):
    name: str

    @property
    def capacity(self) -> int:
        """How many sequences the engine runs at once; the worker reads no more than this."""
        ...

    async def start(self) -> None:
        """Load the model. Called once before the first generate()."""
        ...

    async def stop(self) -> None:
        """Free the model and any threads or subprocesses."""
        ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        """Streams the answer; stops early (finish_reason "abort") after abort(request.id)."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def health(self) -> EngineHealth: ...
