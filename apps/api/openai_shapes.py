"""OpenAI's request and response shapes for /v1/chat/completions: what a request may ask (and a
400 naming the parameter for what Sluice does not do, never a silent ignore; the errors are in
openai_errors.py), and the completion and its stream's chunks.

Pure functions and small classes: no database, no Redis. docs/api.md lists what is supported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from apps.api import openai_formats as formats
from apps.api import openai_images as images
from apps.api import openai_tools as tools
from apps.api.openai_errors import ApiError, invalid, unsupported
from apps.api.openai_messages import messages_of
from apps.chat.prompt.prompting import estimate_tokens

# -- what a chat completion may ask ----------------------------------------------------------

# A field is accepted and ignored when ignoring it cannot change what the caller gets back:
# labels (`metadata`, which only tags stored completions, and Sluice stores none), the end
# user's name for abuse reports (`user`, `safety_identifier`), caching hints
# (`prompt_cache_key`: Sluice routes a conversation to the worker that holds its prefix by
# itself), a style hint models are free to weigh (`verbosity`), a parameter at its neutral
# value (`top_logprobs: 0`), and what a replayed answer carries back (`annotations`,
# `refusal`). A field that would change the answer is refused with a 400 naming it, never
# ignored; a field Sluice does not know is refused too. docs/api.md keeps the list.
VERBOSITY = ("low", "medium", "high")


@dataclass
class ChatRequest:
    model: str
    messages: list[dict]
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    # Named as on the work item: contract/capabilities.py reads either to know what is asked.
    response_format: dict = field(default_factory=dict)  # {}: plain text
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    tools: list[dict] = field(default_factory=list)  # []: none
    tool_choice: str | dict | None = None  # None: auto when there are tools
    parallel_tool_calls: bool | None = None
    logprobs: int | None = None  # None: none; else the alternatives asked for per token
    logit_bias: dict = field(default_factory=dict)
    n: int = 1  # choices, each run as a request of its own (openai_choices.py)

    @property
    def prompt_tokens_estimate(self) -> int:
        texts = [m["content"] for m in self.messages]
        return (
            sum(map(estimate_tokens, texts))
            + estimate_tokens(tools.estimate_text(self.tools, self.messages))
            + images.tokens_estimate(self.messages)
        )


def chat_request(body: dict) -> ChatRequest:
    """The request `body` asks for; ApiError (400, naming the parameter) for anything Sluice
    does not do or cannot read."""
    for name, value in body.items():
        check = CHECKS.get(name)
        if check is None:
            raise invalid(name, f"Unrecognized request argument supplied: {name}")
        check(name, value)
    if "messages" not in body:
        raise invalid("messages", "Missing required parameter: 'messages'.")
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise invalid("model", "`model` must be a model name (GET /v1/models lists them).")
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not stream:
        raise invalid(
            "stream_options",
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
        )
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    stop = body.get("stop")
    offered = tools.tools_of(body.get("tools"))
    return ChatRequest(
        model=(model or "").strip(),
        messages=messages_of(body["messages"]),
        stream=stream,
        include_usage=bool((options or {}).get("include_usage")),
        max_tokens=limit,
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        stop=[stop] if isinstance(stop, str) else list(stop or []),
        response_format=formats.response_format_of(body.get("response_format")),
        seed=body.get("seed"),
        presence_penalty=_float(body.get("presence_penalty")),
        frequency_penalty=_float(body.get("frequency_penalty")),
        tools=offered,
        tool_choice=tools.tool_choice_of(body.get("tool_choice"), offered),
        parallel_tool_calls=body.get("parallel_tool_calls"),
        logprobs=formats.logprobs_of(body.get("logprobs"), body.get("top_logprobs")),
        logit_bias=formats.logit_bias_of(body.get("logit_bias")),
        n=body.get("n") or 1,
    )


def _float(value) -> float | None:
    return None if value is None else float(value)


def _bool(body: dict, name: str) -> bool:
    return bool(body.get(name) or False)


def _number(low: float, high: float):
    def check(name: str, value) -> None:
        if value is None:
            return
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not low <= value <= high:
            raise invalid(name, f"`{name}` must be a number from {low:g} to {high:g}.")

    return check


def _positive_int(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise invalid(name, f"`{name}` must be a whole number of tokens, at least 1.")


def _stop(name: str, value) -> None:
    stops = [value] if isinstance(value, str) else value
    if value is None:
        return
    if (
        not isinstance(stops, list)
        or not 1 <= len(stops) <= 4
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise invalid(name, "`stop` must be a non-empty string or a list of up to 4 of them.")


def _typed(kind, what: str):
    def check(name: str, value) -> None:
        if value is not None and not isinstance(value, kind):
            raise invalid(name, f"`{name}` must be {what}.")

    return check


def _one_of(values: tuple[str, ...]):
    def check(name: str, value) -> None:
        if value is not None and value not in values:
            raise invalid(name, f"`{name}` must be one of {', '.join(values)}.")

    return check


def _refuse_unless(allowed, what: str):
    """A parameter Sluice supports only at its neutral values (those in `allowed`)."""

    def check(name: str, value) -> None:
        if value not in allowed:
            raise unsupported(name, what)

    return check


def _text_only(name: str, value) -> None:
    if value is not None and value != ["text"]:
        raise unsupported(name, "output other than text")


def _absent(what: str):
    def check(name: str, value) -> None:
        if value is not None:
            raise unsupported(name, what)

    return check


CHECKS = {
    "model": lambda name, value: None,  # checked with the request as a whole
    "messages": lambda name, value: None,
    "stream": _typed(bool, "true or false"),
    "stream_options": _typed(dict, 'an object such as {"include_usage": true}'),
    "max_tokens": _positive_int,
    "max_completion_tokens": _positive_int,
    "temperature": _number(0, 2),
    "top_p": _number(0, 1),
    "stop": _stop,
    "user": _typed(str, "a string"),
    "safety_identifier": _typed(str, "a string"),
    "prompt_cache_key": _typed(str, "a string"),
    "metadata": _typed(dict, "an object"),
    "verbosity": _one_of(VERBOSITY),
    # Served where the model's workers can (contract/capabilities.py): checked with the model.
    "tools": tools.check_tools,
    "tool_choice": lambda name, value: None,  # checked against the tools
    "parallel_tool_calls": tools.check_parallel,
    "functions": tools.refuse_legacy,
    "function_call": tools.refuse_legacy,
    # Served where the model's workers can (contract/capabilities.py): checked with the model.
    "response_format": formats.check_response_format,
    "seed": formats.check_seed,
    "presence_penalty": formats.check_penalty,
    "frequency_penalty": formats.check_penalty,
    "logprobs": formats.check_logprobs,
    "top_logprobs": formats.check_top_logprobs,
    "logit_bias": formats.check_logit_bias,
    "n": formats.check_n,
    "store": _refuse_unless((None, False), "storing completions (store)"),
    "service_tier": _refuse_unless((None, "auto", "default"), "service tiers"),
    "modalities": _text_only,
    "audio": _absent("audio output"),
    "prediction": _absent("predicted outputs"),
    "reasoning_effort": _absent("reasoning_effort"),
    "web_search_options": _absent("web search"),
}


# -- what the client receives ------------------------------------------------------------------


def usage_of(usage: dict) -> dict:
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def openai_finish_reason(reason: str | None) -> str:
    """OpenAI's word for why an answer ended. `loop` (the worker cut an answer that repeated
    itself, which happens only where the operator turned loop stopping on for that model) reads
    as `length`: the text was cut before the model ended it, which is what `length` tells a
    client, and `stop` would claim the model finished. docs/api.md says so."""
    if reason == "tool_calls":
        return reason
    return "length" if reason in ("length", "loop") else "stop"


def logprobs_of(entries: list[dict] | None) -> dict | None:
    """A choice's `logprobs`: null unless the request asked for them."""
    return None if entries is None else {"content": entries, "refusal": None}


def choice(
    *,
    index: int = 0,
    text: str,
    finish_reason: str,
    tool_calls: list[dict] | None = None,
    logprobs: list[dict] | None = None,
) -> dict:
    """One choice of a `chat.completion`."""
    message = {"role": "assistant", "content": text, "refusal": None}
    if tool_calls:  # as OpenAI answers a call: no content unless the model wrote some
        message.update(content=text or None, tool_calls=tool_calls)
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs_of(logprobs),
        "finish_reason": openai_finish_reason(finish_reason),
    }


def completion(
    *,
    request_id: str,
    model: str,
    created: int,
    usage: dict,
    text: str = "",
    finish_reason: str = "",
    tool_calls: list[dict] | None = None,
    logprobs: list[dict] | None = None,
    choices: list[dict] | None = None,
) -> dict:
    """A `chat.completion`: the whole answer (`choices`: each of several, from `choice`)."""
    if choices is None:
        choices = [
            choice(text=text, finish_reason=finish_reason, tool_calls=tool_calls, logprobs=logprobs)
        ]
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": choices,
        "usage": usage_of(usage),
    }


ROLE_DELTA = '{"role":"assistant","content":""}'


class Chunks:
    """`data: {chat.completion.chunk}` lines for one answer. The fixed part of every chunk is
    encoded once: a chunk is a few string joins, not a json.dumps of a nested object."""

    def __init__(self, *, request_id: str, model: str, created: int, include_usage: bool) -> None:
        head = {
            "id": f"chatcmpl-{request_id}",
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": None,
        }
        self._head = json.dumps(head)[:-1]  # without its closing brace
        self._usage = ',"usage":null' if include_usage else ""
        self.include_usage = include_usage

    def _choice(
        self, delta: str, finish_reason: str | None, index: int = 0, logprobs: str = "null"
    ) -> str:
        reason = "null" if finish_reason is None else json.dumps(finish_reason)
        return (
            f'{self._head},"choices":[{{"index":{index},"delta":{delta},"logprobs":{logprobs},'
            f'"finish_reason":{reason}}}]{self._usage}}}'
        )

    def role(self, index: int = 0) -> str:
        return f"data: {self._choice(ROLE_DELTA, None, index)}\n\n"

    def text(self, text: str, index: int = 0, logprobs: list[dict] | None = None) -> str:
        """A chunk of text, with its tokens' log probabilities when the request asks for them."""
        scores = "null" if logprobs is None else json.dumps(logprobs_of(logprobs))
        delta = '{"content":' + json.dumps(text) + "}"
        return "data: " + self._choice(delta, None, index, scores) + "\n\n"

    def calls(self, calls: list[dict], index: int = 0) -> str:
        """The chunks of an answer's tool calls (openai_tools.call_deltas)."""
        return "".join(
            "data: " + self._choice(json.dumps({"tool_calls": delta}), None, index) + "\n\n"
            for delta in tools.call_deltas(calls)
        )

    def choice_end(self, finish_reason: str, index: int = 0) -> str:
        """The last chunk of one choice: its finish_reason."""
        return f"data: {self._choice('{}', openai_finish_reason(finish_reason), index)}\n\n"

    def end(self, usage: dict) -> str:
        """The end of the stream: the usage chunk when asked for, and [DONE]."""
        parts = []
        if self.include_usage:
            parts.append(
                f'data: {self._head},"choices":[],"usage":{json.dumps(usage_of(usage))}}}\n\n'
            )
        parts.append("data: [DONE]\n\n")
        return "".join(parts)

    def finish(self, finish_reason: str, usage: dict) -> str:
        """The last chunk of a one-choice answer, the usage chunk when asked for, and [DONE]."""
        return self.choice_end(finish_reason) + self.end(usage)

    @staticmethod
    def error(error: ApiError) -> str:
        """An error after the stream began (the status line is sent by then): the SDKs raise
        it as an APIError."""
        return f"data: {json.dumps(error.body())}\n\ndata: [DONE]\n\n"


def queued_comment(fields: dict[str, str]) -> str:
    """An SSE comment for a position in line: clients ignore it, proxies see traffic, and a
    person reading the raw stream sees where the request stands."""
    line = f": queued, position {fields.get('position', '?')}"
    if fields.get("eta_seconds"):
        line += f", about {fields['eta_seconds']} s"
    if fields.get("reason"):
        line += f" ({fields['reason']})"
    return line + "\n\n"
