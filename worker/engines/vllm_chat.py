"""What the vLLM engine (vllm.py) makes of a request beyond its text: the SamplingParams of its
own fields, its log probabilities in OpenAI's shape, its images, and tools through a vLLM tool
parser, as `vllm serve` serves them.

Tools run only where the operator names a tool parser (`--tool-call-parser`, vLLM's own names:
hermes, llama3_json, mistral, ...), the one that reads what the model was trained to write.
A request with tools is then rendered by vLLM's OnlineRenderer, the code behind `vllm serve`'s
/v1/chat/completions: the tools reach the model's chat template, and the parser adjusts the
request (for `tool_choice` required or a named function, structured outputs hold the answer to
the tool's JSON). The parser reads the answer as it streams: text goes on at once, and the calls'
pieces are gathered and handed on whole when the answer ends (as the `openai` engine does).

A chat template that knows no tools (the demo's SmolLM2) would drop them without a word: the
tools are then described in the system prompt and calls and results replayed as text, in the
Hermes convention of worker/tool_calls.py, which vLLM's `hermes` parser reads back.

vLLM is imported inside the functions: this module imports without it.
"""

from __future__ import annotations

from typing import Any

from contract.capabilities import JSON_OBJECT, JSON_SCHEMA, EngineRefused
from worker import tool_calls
from worker.engines.base import EngineRequest
from worker.engines.openai import CallDeltas


def sampling_of(request: EngineRequest) -> dict[str, Any]:
    """The request's own SamplingParams fields (those it left unset keep the model's
    defaults)."""
    sampling: dict[str, Any] = {}
    for name in ("top_p", "seed", "presence_penalty", "frequency_penalty"):
        if getattr(request, name) is not None:
            sampling[name] = getattr(request, name)
    if request.logprobs is not None:
        sampling["logprobs"] = request.logprobs
    if request.logit_bias:
        sampling["logit_bias"] = {int(t): float(v) for t, v in request.logit_bias.items()}
    kind = request.response_format.get("type")
    if kind in (JSON_OBJECT, JSON_SCHEMA):
        from vllm.sampling_params import StructuredOutputsParams

        if kind == JSON_OBJECT:
            sampling["structured_outputs"] = StructuredOutputsParams(json_object=True)
        else:
            schema = request.response_format.get("json_schema", {}).get("schema", {})
            sampling["structured_outputs"] = StructuredOutputsParams(json=schema)
    return sampling


def openai_logprobs(token_ids, steps, top: int) -> list[dict]:
    """vLLM's log probabilities of the new tokens (per step, token id -> Logprob, holding the
    sampled token and the `top` likeliest) in OpenAI's shape."""
    entries = []
    for token, step in zip(token_ids, steps, strict=False):
        ranked = sorted(step.items(), key=lambda pair: pair[1].rank or 0)
        alternatives = [_logprob_entry(logprob) for _, logprob in ranked[:top]]
        entries.append({**_logprob_entry(step[token]), "top_logprobs": alternatives})
    return entries


def _logprob_entry(logprob) -> dict:
    text = logprob.decoded_token or ""
    return {"token": text, "logprob": logprob.logprob, "bytes": list(text.encode())}


def engine_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as vLLM's renderer reads them: a message with images has its parts (text
    and image_url, in OpenAI's shape) as its content; vLLM decodes a data: URL itself, and
    fetches an http(s) one under its own rules (--allowed-media-domains)."""
    rendered = []
    for message in messages:
        plain = {key: value for key, value in message.items() if key != "parts"}
        if message.get("parts"):
            plain["content"] = [dict(part) for part in message["parts"]]
        rendered.append(plain)
    return rendered


def wants_tools(request: EngineRequest) -> bool:
    """Whether the request goes through the tool parser: it offers tools, or replays calls."""
    return bool(request.tools) or tool_calls.uses_tools(request.messages)


class ToolRenderer:
    """vLLM's OnlineRenderer with the operator's tool parser, for requests with tools."""

    def __init__(self, llm: Any, parser_name: str) -> None:
        from vllm.renderers.online_renderer import OnlineRenderer

        self.model_config = llm.model_config
        self.tokenizer = llm.renderer.tokenizer
        self.online = OnlineRenderer(
            llm.model_config,
            llm.renderer,
            request_logger=None,
            chat_template=None,
            chat_template_content_format="auto",
            enable_auto_tools=True,
            tool_parser=parser_name,
            # A call's arguments held to its tool's schema, as if every tool were `strict`
            # (as on llama.cpp): a small model left free writes arguments that do not fit.
            tool_strict_level="parameter",
        )
        template = getattr(self.tokenizer, "chat_template", None) or ""
        self.template_knows_tools = "tools" in template

    async def render(self, request: EngineRequest) -> tuple[Any, Any, ToolReader]:
        """The engine input, vLLM's ChatCompletionRequest (as the parser adjusted it) and a
        reader of the answer. EngineRefused for what vLLM refuses to render."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        if self.template_knows_tools:
            messages = engine_messages(request.messages)
        else:
            messages = engine_messages(tool_calls.as_text_messages(request))
        body: dict[str, Any] = {"messages": messages, "max_tokens": request.max_tokens}
        if request.tools:
            body["tools"] = request.tools
            body["tool_choice"] = tool_calls.choice_of(request)
        if request.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = request.parallel_tool_calls
        try:
            chat = ChatCompletionRequest.model_validate(body)
            rendered = await self.online.render_chat(chat)
        except ValueError as exc:  # pydantic's ValidationError is one
            raise EngineRefused(f"vLLM cannot render this conversation: {exc}") from None
        if not isinstance(rendered, tuple):  # vLLM's ErrorResponse
            raise EngineRefused(f"vLLM refused it: {rendered.error.message}")
        _, (engine_input,) = rendered
        parser = self.online.parser(
            self.tokenizer,
            chat.tools,
            chat_template_kwargs=self.online.effective_chat_template_kwargs(chat),
            model_config=self.model_config,
        )
        return engine_input, chat, ToolReader(parser, chat)


class ToolReader:
    """Reads an answer through the tool parser: the text to send on from each step, and the
    calls, whole, at the end."""

    def __init__(self, parser: Any, chat: Any) -> None:
        self.parser, self.chat = parser, chat
        self.calls = CallDeltas()

    def feed(self, text: str, token_ids: list[int], prompt_ids: Any, finished: bool) -> str:
        delta = self.parser.parse_delta(
            text, token_ids, self.chat, prompt_token_ids=prompt_ids, finished=finished
        )
        if delta is None:
            return ""
        if delta.tool_calls:
            self.calls.add([call.model_dump(exclude_none=True) for call in delta.tool_calls])
        return delta.content or ""

    def end(self) -> list[dict] | None:
        """The answer's calls in OpenAI's shape (None: it made none)."""
        return self.calls.whole() or None
