"""Any OpenAI-compatible upstream (`vllm serve`, llama.cpp's server, a hosted API), streamed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx

from .base import EngineHealth, EngineOutput, GenerationRequest


class OpenAIEngine:
    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str = "",
        slots: int = 16,
        timeout_seconds: float = 600.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.slots = slots
        self.timeout_seconds = timeout_seconds
        self._client: httpx.AsyncClient | None = None
        self._aborted: set[str] = set()
        self._last_error = ""

    @property
    def capacity(self) -> int:
        return self.slots

    async def start(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._client = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=self.timeout_seconds
        )

    async def stop(self) -> None:
        if self._client:
            await self._client.aclose()

    async def abort(self, request_id: str) -> None:
        # Leaving the response stream closes the HTTP connection, which aborts upstream.
        self._aborted.add(request_id)

    async def health(self) -> EngineHealth:
        assert self._client is not None
        try:
            response = await self._client.get("/models", timeout=5)
            ok = response.status_code < 500
            self._last_error = "" if ok else f"upstream answered {response.status_code}"
        except httpx.HTTPError as exc:
            ok, self._last_error = False, f"upstream unreachable: {exc.__class__.__name__}"
        return EngineHealth(ok=ok, detail=self._last_error or self.base_url)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        assert self._client is not None
        body = {
            "model": self.model,
            "messages": request.messages,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        prompt_tokens = completion_tokens = 0
        async with self._client.stream("POST", "/chat/completions", json=body) as response:
            if response.status_code >= 400:
                detail = (await response.aread()).decode(errors="replace")[:200]
                raise RuntimeError(f"upstream answered {response.status_code}: {detail}")
            async for line in response.aiter_lines():
                if request.id in self._aborted:
                    self._aborted.discard(request.id)
                    yield EngineOutput("", prompt_tokens, completion_tokens, "abort")
                    return
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    prompt_tokens = chunk["usage"].get("prompt_tokens", prompt_tokens)
                    completion_tokens = chunk["usage"].get("completion_tokens", completion_tokens)
                for choice in chunk.get("choices", []):
                    text = (choice.get("delta") or {}).get("content") or ""
                    if text and not chunk.get("usage"):
                        completion_tokens += 1
                    if text or choice.get("finish_reason"):
                        yield EngineOutput(text, prompt_tokens, completion_tokens,
                                           choice.get("finish_reason"))  # fmt: skip
        yield EngineOutput("", prompt_tokens, completion_tokens, "stop")
