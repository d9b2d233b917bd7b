"""Any OpenAI-compatible upstream (`vllm serve`, llama.cpp's server, a hosted API), streamed.

The answer is cut at the request's `max_tokens` here, not left to the upstream (some ignore
it): a token is a streamed chunk with text, unless the upstream reports usage as it goes.

The stream is read with aiohttp: its HTTP parser is in C, and a streamed answer is a hundred
small chunks, each of which a pure-Python client (httpx on anyio) spent more CPU receiving
than the rest of the worker spent relaying it.

A response format, a seed and the penalties go to the upstream as the client sent them: the
upstream enforces them, and refuses what it cannot do (its 400 fails the answer with its words).
So do tools, tool_choice and parallel_tool_calls; the upstream's streamed tool-call deltas are
gathered and handed on whole when its answer ends. So do logprobs, top_logprobs and logit_bias;
each chunk's log probabilities go on with its text.

Image parts go on too, as the client sent them, where the operator says the upstream's model
reads images (`--image-input`): an OpenAI-compatible server does not say what its model reads.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import aiohttp

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
from worker.engines.base import AbortFlags, EngineHealth, EngineOutput, EngineRequest
from worker.tool_calls import new_call_id

# Sent when the request sets them.
PASSED_ON = ("seed", "presence_penalty", "frequency_penalty", "tool_choice", "parallel_tool_calls")
# Once an answer's text flows, each read of its stream first waits this long per answer under
# way, up to READ_PAUSE_MOST_SECONDS, so that it takes every chunk that came meanwhile: the relay
# (engine, attempt, output buffer) then runs once per read instead of once per token, which the
# output writer's clock (60-150 ms) made no finer anyway. The first token is never held and the
# stream's end cuts a wait short; a Stop is seen at the next read. Measured on and off
# (`bench/ab.py b2d4d55 openai_overhead --pairs 3 -- --clients 1,100 --modes plain`): CPU per
# answer 7.9 -> 7.4 ms and 0.94 -> 0.97 of the upstream's answers/s at 100 streams
# (docs/benchmarks.md).
READ_PAUSE_PER_ANSWER_SECONDS = 0.0005  # 100 answers under way: 50 ms
READ_PAUSE_MOST_SECONDS = 0.05
# An upstream's answer that blames the request (a schema it cannot enforce, say), not itself:
# the client is told why, and the worker's circuit breaker does not count it.
REQUEST_FAULTS = (400, 422)


class OpenAIEngine:
    name = "openai"
    capabilities = SAMPLING_AND_STRUCTURED | {TOOLS, LOGPROBS, LOGIT_BIAS, N}

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str = "",
        slots: int = 16,
        timeout_seconds: float = 600.0,
        context_tokens: int | None = None,
        image_input: bool = False,
    ) -> None:
        if image_input:
            self.capabilities = type(self).capabilities | {IMAGE_INPUT}
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.slots = slots
        self.timeout_seconds = timeout_seconds
        # The upstream's window, as its operator states it (--context-tokens): an
        # OpenAI-compatible server does not say its own.
        self._context_tokens = context_tokens
        self._client: aiohttp.ClientSession | None = None
        self._aborted = AbortFlags()
        self._last_error = ""

    @property
    def capacity(self) -> int:
        return self.slots

    @property
    def context_tokens(self) -> int | None:
        return self._context_tokens

    async def start(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._client = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=self.timeout_seconds),
            connector=aiohttp.TCPConnector(limit=self.slots + 2),  # the answers, and a probe
        )

    async def stop(self) -> None:
        if self._client:
            await self._client.close()

    async def abort(self, request_id: str) -> None:
        # Leaving the response stream closes the HTTP connection, which aborts upstream.
        self._aborted.abort(request_id)

    async def health(self) -> EngineHealth:
        assert self._client is not None
        try:
            probe = aiohttp.ClientTimeout(total=5)
            async with self._client.get(self.base_url + "/models", timeout=probe) as response:
                ok = response.status < 500
                self._last_error = "" if ok else f"upstream answered {response.status}"
        except (TimeoutError, aiohttp.ClientError) as exc:
            ok, self._last_error = False, f"upstream unreachable: {exc.__class__.__name__}"
        return EngineHealth(ok=ok, detail=self._last_error or self.base_url)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        assert self._client is not None
        refuse_missing(request, self.capabilities)  # images, unless the operator said so
        answer = UpstreamAnswer(request.max_tokens)
        url = self.base_url + "/chat/completions"
        with self._aborted.running(request.id):
            async with self._client.post(url, json=self._body(request)) as response:
                if response.status >= 400:
                    detail = (await response.read()).decode(errors="replace")[:200]
                    if response.status in REQUEST_FAULTS:  # the request's fault: said as such
                        raise EngineRefused(f"the upstream refused it: {detail}")
                    raise RuntimeError(f"upstream answered {response.status}: {detail}")

                def pause() -> float:  # none before the first token: its time is not held
                    return self._read_pause() if answer.completion_tokens else 0.0

                async for batch in sse_batches(response.content, pause=pause):
                    if request.id in self._aborted:
                        yield answer.output("", "abort")
                        return
                    text, scores, reason = answer.read(batch)
                    if text or scores or (reason and not answer.calls):
                        output = answer.output(text, reason)
                        if request.logprobs is not None:
                            output.logprobs = scores
                        yield output
                    if answer.capped:  # leaving the stream closes it, which stops the upstream
                        return
                    if answer.ended:
                        break
            whole = answer.calls.whole()
            if whole and answer.finish != "length":
                yield EngineOutput(
                    "", answer.prompt_tokens, answer.completion_tokens, "tool_calls", 0, whole
                )
                return
            yield answer.output("", answer.finish or "stop")

    def _read_pause(self) -> float:
        return min(READ_PAUSE_MOST_SECONDS, self._aborted.under_way * READ_PAUSE_PER_ANSWER_SECONDS)

    def _body(self, request: EngineRequest) -> dict:
        body = {
            "model": self.model,
            "messages": [_upstream_message(m) for m in request.messages],
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.top_p is not None:
            body["top_p"] = request.top_p
        if request.stop:
            body["stop"] = request.stop
        if request.response_format:
            body["response_format"] = request.response_format
        if request.tools:
            body["tools"] = request.tools
        if request.logprobs is not None:
            body.update(logprobs=True, top_logprobs=request.logprobs)
        if request.logit_bias:
            body["logit_bias"] = request.logit_bias
        for name in PASSED_ON:
            if getattr(request, name) is not None:
                body[name] = getattr(request, name)
        return body


class UpstreamAnswer:
    """What an upstream's streamed answer has said so far, read a batch of chunks at a time:
    one output per batch, so the relay (attempt, output buffer) runs once per read rather than
    once per token."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.prompt_tokens = self.completion_tokens = 0
        self.calls = CallDeltas()
        self.finish: str | None = None  # the upstream's own reason, "length" included
        self.capped = False  # cut at max_tokens here
        self.ended = False  # [DONE] came

    def output(self, text: str, reason: str | None) -> EngineOutput:
        return EngineOutput(text, self.prompt_tokens, self.completion_tokens, reason)

    def read(self, batch: list[str]) -> tuple[str, list[dict], str | None]:
        """The batch's text, its tokens' log probabilities, and its finish reason, if any."""
        texts: list[str] = []
        scores: list[dict] = []
        reason = None
        for data in batch:
            if data == "[DONE]":
                self.ended = True
                break
            chunk = json.loads(data)
            usage = chunk.get("usage")
            if usage:
                self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
                self.completion_tokens = usage.get("completion_tokens", self.completion_tokens)
            for choice in chunk.get("choices", []):
                delta = choice.get("delta") or {}
                text = delta.get("content") or ""
                grew = self.calls.add(delta.get("tool_calls"))
                if (text or grew) and not usage:
                    self.completion_tokens += 1
                reason = choice.get("finish_reason") or reason
                # The answer cap is Sluice's to keep: an upstream may ignore `max_tokens` (or
                # count differently), so the answer is cut here.
                if self.completion_tokens >= self.max_tokens and not reason:
                    self.capped, reason = True, "length"
                if text:
                    texts.append(text)
                scores += (choice.get("logprobs") or {}).get("content") or []
                if self.capped:
                    break
            if self.capped:
                break
        self.finish = reason or self.finish
        return "".join(texts), scores, reason


def _upstream_message(message: dict) -> dict:
    """A message as an upstream reads it: an assistant message that only calls tools has no
    content (null, as OpenAI writes it), rather than an empty text; a message with images has
    its parts as its content."""
    if message.get("parts"):
        return {key: value for key, value in message.items() if key != "parts"} | {
            "content": message["parts"]
        }
    if message.get("tool_calls") and not message.get("content"):
        return {**message, "content": None}
    return message


class CallDeltas:
    """The tool calls of a streamed answer, gathered from their deltas: each call's first delta
    has its index, id and name, and its arguments come in pieces."""

    def __init__(self) -> None:
        self.calls: dict[int, dict] = {}

    def __bool__(self) -> bool:
        return bool(self.calls)

    def add(self, deltas: list[dict] | None) -> bool:
        """Takes a chunk's `tool_calls` deltas; whether there were any."""
        for delta in deltas or []:
            call = self.calls.setdefault(
                int(delta.get("index") or 0),
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            call["id"] = delta.get("id") or call["id"]
            function = delta.get("function") or {}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""
        return bool(deltas)

    def whole(self) -> list[dict]:
        """The calls in order, each with an id (one the upstream left out is made up)."""
        calls = [self.calls[index] for index in sorted(self.calls)]
        for call in calls:
            call["id"] = call["id"] or new_call_id()
        return calls


async def sse_batches(
    content, *, pause: Callable[[], float] | None = None
) -> AsyncIterator[list[str]]:
    """The `data:` payloads of an SSE body, a list per read of whatever the network has handed
    over (a streamed answer is two lines per token). Once a payload has come, each read first
    waits `pause()` seconds, so that it takes every chunk that arrives meanwhile; the body's
    end cuts the wait short, so the answer's end is not held."""
    loop = asyncio.get_running_loop()
    waking: list[asyncio.Future] = []  # the wait under way, if any

    def wake() -> None:
        if waking and not waking[0].done():
            waking[0].set_result(None)

    content.on_eof(wake)
    rest = b""
    started = False
    async for piece in content.iter_any():
        lines = (rest + piece).split(b"\n")
        rest = lines.pop()
        batch = [line[5:].strip().decode() for line in lines if line.startswith(b"data:")]
        if batch:
            yield batch
            started = True
        wait = pause() if started and pause is not None else 0.0
        if wait > 0 and not content.is_eof():
            waking[:] = [loop.create_future()]
            timer = loop.call_later(wait, wake)
            try:
                await waking[0]
            finally:
                timer.cancel()
                waking.clear()
    if rest.startswith(b"data:"):  # a last line without its newline
        yield [rest[5:].strip().decode()]
