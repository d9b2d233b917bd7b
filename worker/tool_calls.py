"""Tool calls for engines that see only text: the tools described in the system prompt, calls
and their results replayed as text, and the model's calls read back out of its answer.

A call is written `<tool_call>` JSON `</tool_call>`, the JSON being `{"name": ..., "arguments":
{...}}` (the convention of the Hermes and Qwen chat templates, which many small models have
seen). The llama.cpp engine holds the model to it with a grammar (llamacpp_tools.py), so what
comes back parses; this module knows only the text.

A call travels between the worker and the web in OpenAI's own shape:
`{"id": "call_...", "type": "function", "function": {"name": ..., "arguments": "<JSON text>"}}`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

CALL_OPEN = "<tool_call>\n"
CALL_CLOSE = "\n</tool_call>"
RESULT_OPEN = "<tool_response>\n"
RESULT_CLOSE = "\n</tool_response>"

AUTO, NONE, REQUIRED = "auto", "none", "required"


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def choice_of(request: Any) -> str | dict:
    """The request's tool_choice, with OpenAI's default: auto when it sends tools."""
    if not request.tools:
        return NONE
    return request.tool_choice or AUTO


def may_call(request: Any) -> bool:
    """Whether the answer may be a tool call (tools sent, and tool_choice is not none)."""
    return choice_of(request) != NONE


def must_call(request: Any) -> bool:
    """Whether the answer must be a tool call (tool_choice required, or a named function)."""
    return choice_of(request) not in (AUTO, NONE)


def named(request: Any) -> str | None:
    """The function tool_choice names, if it names one."""
    choice = choice_of(request)
    return choice["function"]["name"] if isinstance(choice, dict) else None


def uses_tools(messages: list[dict[str, Any]]) -> bool:
    """Whether a conversation replays tool calls or their results."""
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def call_text(name: str, arguments: Any) -> str:
    return f"{CALL_OPEN}{json.dumps({'name': name, 'arguments': arguments})}{CALL_CLOSE}"


def instructions(tools: list[dict], *, only: str | None = None) -> str:
    """What the system prompt says about the tools: each one's name, description and
    parameters as JSON, how to call one, and what to do with a result. (Worded as the demo's
    135M model follows best: with a result in hand it answers in words rather than calling
    the same function again.)"""
    lines = ["You can call these functions:"]
    lines += [json.dumps(tool["function"], ensure_ascii=False) for tool in tools]
    lines.append(
        f'To call a function, reply with {CALL_OPEN}{{"name": <function name>, '
        f'"arguments": <arguments as JSON>}}{CALL_CLOSE}'
    )
    if only:
        lines.append(f"Call the function {only} now.")
    lines.append(
        "A function's result comes back as a tool message: answer the user with it in plain words."
    )
    return "\n".join(lines)


def as_text_messages(request: Any) -> list[dict[str, str]]:
    """The request's conversation as plain {role, content} messages for a chat template that
    knows nothing of tools: calls and results written as text, the tools described in the
    system prompt when the answer may call one."""
    rendered: list[dict[str, str]] = []
    for message in request.messages:
        role, content = message["role"], message.get("content") or ""
        if message.get("tool_calls"):
            calls = [
                call_text(call["function"]["name"], _loaded(call["function"]["arguments"]))
                for call in message["tool_calls"]
            ]
            content = "\n".join([content, *calls] if content else calls)
        elif role == "tool":
            content = f"{RESULT_OPEN}{content}{RESULT_CLOSE}"
        rendered.append({"role": role, "content": content})
        if message.get("parts"):  # images, for an engine that reads them
            rendered[-1]["parts"] = message["parts"]
    if may_call(request):
        described = instructions(request.tools, only=named(request))
        if rendered and rendered[0]["role"] == "system":
            rendered[0] = {"role": "system", "content": f"{rendered[0]['content']}\n\n{described}"}
        else:
            rendered.insert(0, {"role": "system", "content": described})
    return rendered


def _loaded(arguments: str) -> Any:
    """A replayed call's arguments as JSON where they are JSON (as the model would write them)."""
    try:
        return json.loads(arguments)
    except (TypeError, ValueError):
        return arguments


def parse_calls(text: str) -> list[dict] | None:
    """The calls an answer makes, in OpenAI's shape; None when the text is not a whole series
    of calls (cut short by the answer's cap, say)."""
    decoder = json.JSONDecoder()
    opening, closing = CALL_OPEN.strip(), CALL_CLOSE.strip()
    calls: list[dict] = []
    rest = text.strip()
    while rest:
        if not rest.startswith(opening):
            return None
        try:
            call, end = decoder.raw_decode(rest[len(opening) :].lstrip())
        except ValueError:
            return None
        rest = rest[len(opening) :].lstrip()[end:].lstrip()
        if not rest.startswith(closing):
            return None
        rest = rest[len(closing) :].lstrip()
        name = call.get("name") if isinstance(call, dict) else None
        arguments = call.get("arguments") if isinstance(call, dict) else None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return None
        calls.append(
            {
                "id": new_call_id(),
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
            }
        )
    return calls or None


class CallWatch:
    """Reads an answer as it streams: plain text goes on at once, a tool call is held back and
    parsed when the answer ends (a client is sent the call whole, never half of its JSON)."""

    def __init__(self) -> None:
        self.held: list[str] = []
        self.calling: bool | None = None  # None: the answer's start could still be either

    def feed(self, text: str) -> str:
        """The part of `text` to send on now."""
        if self.calling is False:
            return text
        self.held.append(text)
        so_far = "".join(self.held)
        opening = CALL_OPEN.strip()
        if so_far.startswith(opening):
            self.calling = True
        elif not opening.startswith(so_far.lstrip()):
            self.calling = False
            self.held.clear()
            return so_far
        return ""

    def end(self) -> tuple[list[dict] | None, str]:
        """The calls the answer made (None: none), and any held text that turned out not to be
        a whole call, to be sent as text (the model's words, kept as written)."""
        held = "".join(self.held)
        self.held.clear()
        calls = parse_calls(held) if self.calling else None
        return calls, "" if calls else held
