"""Tools in a chat completion: `tools`, `tool_choice` and `parallel_tool_calls` read into the
form the work item carries (or a 400 naming the parameter), calls and results replayed in
`messages`, and the calls an answer makes as the client receives them, whole or streamed.

Whether the chosen model's workers can serve tools is decided by contract/capabilities.py when
the model is known. The legacy `functions` and `function_call` are refused with a 400 that
says what to send instead: answering them means another response shape (`message.
function_call`), which no current client asks for.

Pure functions: no database, no Redis.
"""

from __future__ import annotations

import json

from apps.api import openai_formats as formats
from apps.api.openai_errors import invalid, unsupported

# OpenAI's own limits on the tools of one request.
MAX_TOOLS = 128
MAX_DESCRIPTION_CHARS = 8 * 1024
FUNCTION_FIELDS = ("name", "description", "parameters", "strict")
CHOICES = ("none", "auto", "required")
MAX_CALLS = 128  # replayed calls in one assistant message
MAX_CALL_ID_CHARS = 256


def tools_of(value) -> list[dict]:
    """The tools as the work item carries them: `{"type": "function", "function": {name,
    description?, parameters?, strict?}}` each; [] for none."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise invalid("tools", f"`tools` must be a list of at most {MAX_TOOLS} function tools.")
    tools, names = [], set()
    for index, tool in enumerate(value):
        where = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise invalid(where, f'`{where}` must be {{"type": "function", "function": {{...}}}}.')
        function = _function(tool.get("function"), f"{where}.function")
        if function["name"] in names:
            raise invalid(f"{where}.function.name", f"Two tools are named {function['name']}.")
        names.add(function["name"])
        tools.append({"type": "function", "function": function})
    return tools


def _function(spec, where: str) -> dict:
    name = formats.named_object(spec, where, FUNCTION_FIELDS, "an object with a `name`")
    function: dict = {"name": name}
    description = spec.get("description")
    if description is not None:
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS:
            raise invalid(
                f"{where}.description",
                f"`{where}.description` must be a string of at most {MAX_DESCRIPTION_CHARS} "
                "characters.",
            )
        function["description"] = description
    if spec.get("parameters") is not None:
        function["parameters"] = formats.checked_schema(spec["parameters"], f"{where}.parameters")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid(f"{where}.strict", f"`{where}.strict` must be true or false.")
    if strict is not None:
        function["strict"] = strict
    return function


def tool_choice_of(value, tools: list[dict]) -> str | dict | None:
    """The tool_choice as the work item carries it (None: OpenAI's default, auto with tools)."""
    if value is None:
        return None
    if value in CHOICES:
        if value != "none" and not tools:
            raise invalid("tool_choice", "`tool_choice` is only allowed when `tools` are given.")
        return value
    if not isinstance(value, dict):
        value = {}
    function = value.get("function")
    if value.get("type") != "function" or not isinstance(function, dict):
        raise invalid(
            "tool_choice",
            '`tool_choice` must be none, auto, required or {"type": "function", "function": '
            '{"name": ...}}.',
        )
    name = function.get("name")
    if name not in {tool["function"]["name"] for tool in tools}:
        raise invalid("tool_choice", f"`tool_choice` names a function not in `tools`: {name}")
    return {"type": "function", "function": {"name": name}}


def check_tools(name: str, value) -> None:
    tools_of(value)


def check_parallel(name: str, value) -> None:
    if value is not None and not isinstance(value, bool):
        raise invalid(name, f"`{name}` must be true or false.")


def refuse_legacy(name: str, value) -> None:
    """`functions` and `function_call`, OpenAI's names before tools."""
    if value not in (None, [], "none"):
        raise unsupported(
            name, "the legacy `functions` and `function_call`: send `tools` and `tool_choice`"
        )


# -- calls and results replayed in the conversation --------------------------------------------


def calls_of(value, where: str) -> list[dict]:
    """An assistant message's `tool_calls`, as its answer returned them."""
    where = f"{where}.tool_calls"
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_CALLS:
        raise invalid(where, f"`{where}` must be a list of at most {MAX_CALLS} calls.")
    calls = []
    for index, call in enumerate(value):
        at = f"{where}[{index}]"
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(function, dict)
            or call.get("type", "function") != "function"
            or not _call_id(call.get("id"))
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments"), str)
        ):
            raise invalid(
                at,
                f'`{at}` must be {{"id": ..., "type": "function", "function": {{"name": ..., '
                '"arguments": "<JSON text>"}}.',
            )
        calls.append(
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": function["name"], "arguments": function["arguments"]},
            }
        )
    return calls


def call_id_of(message: dict, where: str) -> str:
    """A tool message's `tool_call_id`: which call its content answers."""
    value = message.get("tool_call_id")
    if not _call_id(value):
        raise invalid(
            f"{where}.tool_call_id", f"`{where}.tool_call_id` must name the call it answers."
        )
    return value


def _call_id(value) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_CALL_ID_CHARS


def estimate_text(tools: list[dict], messages: list[dict]) -> str:
    """The text tools add to a prompt, for its token estimate: their descriptions and the
    replayed calls' arguments."""
    calls = [c["function"] for m in messages for c in m.get("tool_calls") or ()]
    if not calls and not tools:
        return ""
    return json.dumps([tool["function"] for tool in tools]) + json.dumps(calls)


# -- what the client receives ------------------------------------------------------------------


def call_deltas(calls: list[dict]) -> list[list[dict]]:
    """The `tool_calls` deltas of a stream's chunks, in OpenAI's order: for each call, a chunk
    with its index, id, type and name (arguments empty), then one with its arguments."""
    deltas = []
    for index, call in enumerate(calls):
        function = call["function"]
        deltas.append(
            [
                {
                    "index": index,
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": function["name"], "arguments": ""},
                }
            ]
        )
        deltas.append([{"index": index, "function": {"arguments": function["arguments"]}}])
    return deltas
