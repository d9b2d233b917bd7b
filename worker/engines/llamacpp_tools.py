"""Tool calls on llama.cpp: a grammar that holds the model to plain text or to calls of the
request's tools, each call's arguments held to that tool's parameter schema.

llama-cpp-python also has function-calling chat handlers (`chat_format="chatml-function-calling"`
and the functionary ones). They need a model trained on their format or a chat format fixed
when the model loads, and the demo's 135M model, left free, writes calls that do not parse.
A grammar works with any model and any chat template: the answer's first token decides between
text and `<tool_call>`, and from there the sampler can only write JSON that the tool's schema
allows (worker/tool_calls.py reads it back).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from contract.capabilities import EngineRefused
from worker import tool_calls

# Calls in one answer when parallel calls are allowed: a small model given the chance repeats
# a call until its token cap, and a bounded grammar ends the answer instead.
MAX_PARALLEL_CALLS = 4


def grammar_for_tools(request: Any):
    """The grammar for a request that may call its tools (tool_calls.may_call)."""
    wanted = tool_calls.named(request)
    tools = [
        tool["function"]
        for tool in request.tools
        if wanted is None or tool["function"]["name"] == wanted
    ]
    parallel = request.parallel_tool_calls is not False and wanted is None
    return _grammar(
        json.dumps(tools, sort_keys=True), tool_calls.must_call(request), bool(parallel)
    )


@functools.lru_cache(maxsize=64)
def _grammar(functions: str, must_call: bool, parallel: bool):
    """Kept per set of tools: an agent sends the same tools with every turn, and building the
    grammar costs milliseconds before the answer's first token."""
    from llama_cpp import LlamaGrammar

    calls = f'call ("\\n" call){{0,{MAX_PARALLEL_CALLS - 1}}}' if parallel else "call"
    # Plain text starts with anything but "<", so the first character settles which it is.
    root = f"root ::= {calls}" if must_call else f"root ::= {calls} | text\ntext ::= [^<] .*"
    call = f"call ::= {_literal(tool_calls.CALL_OPEN)} tool-call {_literal(tool_calls.CALL_CLOSE)}"
    try:
        return LlamaGrammar.from_string(
            "\n".join((root, call, _call_rules(json.loads(functions)))), verbose=False
        )
    except Exception as exc:  # a schema feature llama.cpp's converter does not know
        raise EngineRefused(f"llama.cpp cannot enforce these tools' parameters ({exc})") from None


def _call_rules(functions: list[dict]) -> str:
    """GBNF rules whose `tool-call` is one `{"name": ..., "arguments": {...}}` object."""
    from llama_cpp.llama_grammar import SchemaConverter

    shapes = [
        {
            "type": "object",
            "properties": {
                "name": {"const": function["name"]},
                "arguments": _closed(function.get("parameters") or {"type": "object"}),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for function in functions
    ]
    converter = SchemaConverter(
        prop_order={"name": 0, "arguments": 1}, allow_fetch=False, dotall=False, raw_pattern=False
    )
    schema = shapes[0] if len(shapes) == 1 else {"anyOf": shapes}
    converter.visit(converter.resolve_refs(schema, "tools"), "tool-call")
    return converter.format_grammar()


def _closed(parameters: dict) -> dict:
    """The parameters' schema without room for properties it does not name: a schema that does
    not forbid them allows any, and a small model fills that room with invented keys. What the
    grammar then allows still matches the schema."""
    if parameters.get("type") == "object" and "additionalProperties" not in parameters:
        return {**parameters, "additionalProperties": False}
    return parameters


def _literal(text: str) -> str:
    return json.dumps(text)
