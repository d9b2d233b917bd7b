"""A Responses API request (`POST /v1/responses`) read into the chat completion it amounts to.

The Responses API is served on the chat completions path: its `input` items become `messages`,
`instructions` a system message before them, its flat function tools and `text.format` the
chat shapes, and the result is read by the same `openai_shapes.chat_request` every chat
completion goes through. So both APIs share one set of checks, one admission, queue and plan,
one set of capability checks and one usage row per answer. What only the Responses API has is
kept beside (`Echo`), for the response object to repeat, as OpenAI's does.

Sluice stores no responses: `store` must be false or absent, and `previous_response_id` or
`conversation` (which would read a stored one) are refused with a 400 that says to send the
earlier turns in `input`. docs/api.md lists what is supported.

Pure functions: no database, no Redis.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from apps.api import openai_shapes as shapes
from apps.api.openai_errors import ApiError, invalid, unsupported

# Fields read and then ignored because ignoring them cannot change the answer (as for chat
# completions: labels, the end user's name for abuse reports, caching and style hints).
IGNORED = ("user", "safety_identifier", "prompt_cache_key", "stream_options")
TEXT_ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text")
MESSAGE_EXTRAS = ("id", "status", "type", "phase")  # what a replayed output message carries
CALL_EXTRAS = ("id", "status", "type")
NOT_STORED = (
    "Sluice stores no responses, so `{name}` cannot be followed: send the earlier turns "
    "(and the function calls and their outputs) in `input`."
)


@dataclass
class Echo:
    """What the response object repeats of its request (OpenAI's response does)."""

    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict] = field(default_factory=list)  # in the Responses shape
    tool_choice: str | dict = "auto"
    parallel_tool_calls: bool = True
    text: dict = field(default_factory=lambda: {"format": {"type": "text"}})
    metadata: dict = field(default_factory=dict)


def responses_request(body: dict) -> tuple[shapes.ChatRequest, Echo]:
    """The chat completion a Responses request asks for, and what its response repeats; an
    ApiError (400, naming the Responses parameter) for anything Sluice does not do."""
    if "input" not in body:
        raise invalid("input", "Missing required parameter: 'input'.")
    chat: dict = {}
    for name, value in body.items():
        if name in IGNORED:
            continue
        read = READERS.get(name)
        if read is None:
            raise invalid(name, f"Unrecognized request argument supplied: {name}")
        read(name, value, chat)
    instructions = body.get("instructions")
    if instructions:
        chat["messages"].insert(0, {"role": "system", "content": instructions})
    try:
        asked = shapes.chat_request(chat)
    except ApiError as error:
        raise renamed(error) from None
    echo = Echo(
        instructions=instructions,
        max_output_tokens=body.get("max_output_tokens"),
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        tools=list(body.get("tools") or []),
        tool_choice=body.get("tool_choice") or "auto",
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        text={"format": (body.get("text") or {}).get("format") or {"type": "text"}},
        metadata=dict(body.get("metadata") or {}),
    )
    return asked, echo


# -- errors named as the Responses API names the parameter --------------------------------------

# The chat completion's parameter → the Responses parameter that became it.
RENAMES = (
    (re.compile(r"^messages(\[\d+\])?(\..*)?$"), "input"),
    (re.compile(r"^max_(completion_)?tokens$"), "max_output_tokens"),
    (re.compile(r"^response_format(\.json_schema)?"), "text.format"),
    (re.compile(r"^tools(\[\d+\])\.function"), r"tools\1"),
    (re.compile(r"^tool_choice\.function"), "tool_choice"),
)


def responses_param(param: str | None) -> str | None:
    for pattern, replacement in RENAMES if param else ():
        if pattern.search(param):
            return pattern.sub(replacement, param)
    return param


def renamed(error: ApiError) -> ApiError:
    """`error` (raised on the chat completions path) naming the Responses parameter."""
    param = responses_param(error.param)
    if param != error.param:
        error.message = error.message.replace(f"`{error.param}`", f"`{param}`")
        error.param = param
    return error


# -- each parameter, read into the chat completion --------------------------------------------


def _same(chat_name: str | None = None):
    """A parameter the chat completion has as it is (under `chat_name`)."""

    def read(name: str, value, chat: dict) -> None:
        chat[chat_name or name] = value

    return read


def _instructions(name: str, value, chat: dict) -> None:
    if value is not None and not isinstance(value, str):
        raise unsupported(name, "`instructions` other than a string")


def _store(name: str, value, chat: dict) -> None:
    if value not in (None, False):
        raise invalid(
            name,
            "Sluice stores no responses: send `store: false` (or leave it out) and keep the "
            "conversation in `input`.",
            code="unsupported_parameter",
        )


def _not_stored(name: str, value, chat: dict) -> None:
    if value is not None:
        raise invalid(name, NOT_STORED.format(name=name), code="unsupported_parameter")


def _neutral(allowed, what: str):
    def read(name: str, value, chat: dict) -> None:
        if value not in allowed:
            raise unsupported(name, what)

    return read


def _text(name: str, value, chat: dict) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or set(value) - {"format", "verbosity"}:
        raise invalid(name, '`text` must be an object such as {"format": {"type": "text"}}.')
    if value.get("verbosity") is not None:
        chat["verbosity"] = value["verbosity"]
    spec = value.get("format")
    if spec is None:
        return
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind == "json_schema":  # flat here; nested under `json_schema` in a chat completion
        inner = {key: item for key, item in spec.items() if key != "type"}
        chat["response_format"] = {"type": kind, "json_schema": inner}
    elif kind in ("text", "json_object"):
        chat["response_format"] = {"type": kind}
    else:
        raise invalid("text.format", "`text.format.type` must be text, json_object or json_schema.")


def _tools(name: str, value, chat: dict) -> None:
    """Function tools, flat here ({type, name, description, parameters, strict}); the hosted
    tools (web search, file search, code interpreter...) are OpenAI's own services."""
    if value is None:
        return
    if not isinstance(value, list):
        raise invalid(name, "`tools` must be a list of function tools.")
    tools = []
    for index, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise unsupported(
                f"tools[{index}].type", f"{kind or 'these'} tools: only function tools"
            )
        function = {key: item for key, item in tool.items() if key != "type"}
        tools.append({"type": "function", "function": function})
    chat["tools"] = tools


def _tool_choice(name: str, value, chat: dict) -> None:
    if isinstance(value, dict) and value.get("type") == "function":
        value = {"type": "function", "function": {"name": value.get("name")}}
    elif isinstance(value, dict):
        raise unsupported(name, f"`tool_choice` of type {value.get('type')!r}")
    chat["tool_choice"] = value


def _input(name: str, value, chat: dict) -> None:
    chat["messages"] = messages_of_input(value)


def messages_of_input(value) -> list[dict]:
    """`input` (a string, or a list of items) as chat messages: messages as they are, a
    function call as an assistant message's tool call (calls one after another, and the text
    just before them, in one message, as a chat completion replays them), a call's output as a
    tool message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise invalid("input", "`input` must be a string or a non-empty list of input items.")
    messages: list[dict] = []
    for index, item in enumerate(value):
        where = f"input[{index}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = _call(item, where)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                last["content"] = last["content"] or None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(_call_output(item, where))
        elif kind == "item_reference":
            raise invalid(f"{where}.type", NOT_STORED.format(name="item_reference"))
        else:
            raise unsupported(f"{where}.type", f"input items of type {kind!r}")
    return messages


def _message(item: dict, where: str) -> dict:
    role = item.get("role")
    if role not in TEXT_ROLES:
        raise invalid(f"{where}.role", f"`{where}.role` must be one of {', '.join(TEXT_ROLES)}.")
    for key in item:
        if key not in ("role", "content", *MESSAGE_EXTRAS):
            raise invalid(f"{where}.{key}", f"Unrecognized input item field: {key}")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise invalid(f"{where}.content", f"`{where}.content` must be text or a list of parts.")
    parts = []
    for at, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image":
            parts.append(_image(part, f"{where}.content[{at}]"))
        elif kind in ("input_file", "input_audio"):
            raise unsupported(f"{where}.content[{at}]", f"{kind} content: the models read text")
        else:
            raise invalid(
                f"{where}.content[{at}]",
                f'`{where}.content[{at}]` must be {{"type": "input_text", "text": ...}}.',
            )
    if any(part["type"] == "image_url" for part in parts):  # checked as a chat completion's
        return {"role": role, "content": parts}
    return {"role": role, "content": "\n".join(part["text"] for part in parts)}


def _image(part: dict, where: str) -> dict:
    """An `input_image` part ({image_url, detail}) as the chat completion's `image_url` part;
    a stored file (`file_id`) cannot be read."""
    for key in part:
        if key not in ("type", "image_url", "detail", "file_id"):
            raise invalid(f"{where}.{key}", f"Unrecognized input_image field: {key}")
    if part.get("file_id") is not None:
        raise unsupported(f"{where}.file_id", "stored files: send the image as image_url")
    if not isinstance(part.get("image_url"), str):
        raise invalid(f"{where}.image_url", f"`{where}.image_url` must be a URL.")
    detail = part.get("detail")
    image = {"url": part["image_url"], **({"detail": detail} if detail is not None else {})}
    return {"type": "image_url", "image_url": image}


def _call(item: dict, where: str) -> dict:
    for key in item:
        if key not in ("call_id", "name", "arguments", *CALL_EXTRAS):
            raise invalid(f"{where}.{key}", f"Unrecognized function_call field: {key}")
    if not all(isinstance(item.get(key), str) for key in ("call_id", "name", "arguments")):
        raise invalid(
            where, f"`{where}` must have a `call_id`, a `name` and `arguments` (JSON text)."
        )
    function = {"name": item["name"], "arguments": item["arguments"]}
    return {"id": item["call_id"], "type": "function", "function": function}


def _call_output(item: dict, where: str) -> dict:
    for key in item:
        if key not in ("call_id", "output", *CALL_EXTRAS):
            raise invalid(f"{where}.{key}", f"Unrecognized function_call_output field: {key}")
    output = item.get("output")
    if isinstance(output, list):  # text parts
        output = _message({"role": "user", "content": output}, where)["content"]
    if not isinstance(item.get("call_id"), str) or not isinstance(output, str):
        raise invalid(where, f"`{where}` must have the `call_id` it answers and an `output`.")
    return {"role": "tool", "tool_call_id": item["call_id"], "content": output}


READERS = {
    "model": _same(),
    "input": _input,
    "instructions": _instructions,
    "stream": _same(),
    "max_output_tokens": _same("max_tokens"),
    "temperature": _same(),
    "top_p": _same(),
    "tools": _tools,
    "tool_choice": _tool_choice,
    "parallel_tool_calls": _same(),
    "text": _text,
    "metadata": _same(),
    "store": _store,
    "previous_response_id": _not_stored,
    "conversation": _not_stored,
    "background": _neutral((None, False), "background responses (background)"),
    "truncation": _neutral((None, "disabled"), "truncating the input (truncation: auto)"),
    "include": _neutral((None, []), "extra output (include)"),
    "reasoning": _neutral((None, {}), "reasoning options (reasoning)"),
    "service_tier": _neutral((None, "auto", "default"), "service tiers"),
    "max_tool_calls": _neutral((None,), "max_tool_calls"),
    "top_logprobs": _neutral((None, 0), "log probabilities in the Responses API"),
    "prompt": _neutral((None,), "stored prompts (prompt)"),
}
