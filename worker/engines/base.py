"""The interface every engine implements, and what flows through it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class EngineRequest:
    id: str
    # Chat messages; the engine applies the model's template. An assistant message may carry
    # `tool_calls` and a `tool` message a `tool_call_id`, in OpenAI's shape.
    messages: list[dict[str, Any]]
    max_tokens: int = 512
    temperature: float = 0.7
    top_p: float | None = None  # None: the engine's (or the model's) default
    stop: list[str] = field(default_factory=list)  # the answer ends before any of these
    # OpenAI's response_format ({}: plain text): {"type": "json_object"}, or {"type":
    # "json_schema", "json_schema": {"name", "schema", "strict"}}; the engine enforces it.
    response_format: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None  # None: the engine's own randomness
    presence_penalty: float | None = None  # None: none
    frequency_penalty: float | None = None
    # OpenAI's function tools ([]: none), tool_choice (None: auto when there are tools) and
    # parallel_tool_calls (None: allowed); worker/tool_calls.py reads them.
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # None: no log probabilities; else each token's with this many likeliest alternatives
    # (0 to 20), in OpenAI's shape on each output (EngineOutput.logprobs).
    logprobs: int | None = None
    logit_bias: dict[str, float] = field(default_factory=dict)  # token id (as text) -> bias


@dataclass
class EngineOutput:
    """One step of a generation: new text, and the token counts so far."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None  # "stop", "length", "abort" on the last output
    cached_tokens: int = 0  # of the prompt tokens, those found in the engine's KV cache
    # The calls the answer makes, whole, in OpenAI's shape (worker/tool_calls.py), on the last
    # output, whose finish_reason is then "tool_calls".
    tool_calls: list[dict[str, Any]] | None = None
    # When the request asks for them: an entry per token of `text`, in OpenAI's shape
    # ({"token", "logprob", "bytes", "top_logprobs": [...]}).
    logprobs: list[dict[str, Any]] | None = None


@dataclass
class EngineHealth:
    ok: bool
    detail: str = ""
    # Engine figures the dispatcher uses (KV-cache use, running / waiting sequences, prefix-cache
    # hit rate, ...); copied verbatim into the worker's heartbeat.
    metrics: dict[str, Any] = field(default_factory=dict)


class Engine(Protocol):
    name: str
    # What the engine serves beyond plain sampling (contract/capabilities.py), announced in
    # every heartbeat.
    capabilities: frozenset[str]

    @property
    def capacity(self) -> int:
        """How many sequences the engine runs at once; the worker reads no more than this."""
        ...

    @property
    def context_tokens(self) -> int | None:
        """The model's context window as the engine runs it, in tokens (a prompt and its
        answer together); None when the engine cannot know. The worker's heartbeat reports it,
        and the web builds prompts that fit it."""
        ...

    async def start(self) -> None:
        """Load the model. Called once before the first generate()."""
        ...

    async def stop(self) -> None:
        """Free the model and any threads or subprocesses."""
        ...

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Streams the answer; stops early (finish_reason "abort") after abort(request.id)."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def health(self) -> EngineHealth: ...


class AbortFlags:
    """The generations asked to stop, for engines that look for a flag between tokens.

    Only a generation under way is flagged: an abort that comes after its generation ended, or
    before it began (a generation begun ahead of its claim and dropped unread, ahead.py), has
    nothing to stop, and its flag would otherwise stay for the life of the worker. A flag goes
    when its generation ends, however it ends."""

    def __init__(self) -> None:
        self._running: set[str] = set()
        self._aborted: set[str] = set()

    @contextmanager
    def running(self, request_id: str) -> Iterator[None]:
        """Around a generation's body: it can be flagged while inside."""
        self._running.add(request_id)
        try:
            yield
        finally:
            self._running.discard(request_id)
            self._aborted.discard(request_id)

    @property
    def under_way(self) -> int:
        """Generations running now."""
        return len(self._running)

    def abort(self, request_id: str) -> None:
        if request_id in self._running:
            self._aborted.add(request_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._aborted

    def __len__(self) -> int:
        """Flags and generations held (none once every generation has ended)."""
        return len(self._running) + len(self._aborted)
