"""The `messages` of a chat completion, read into the form the work item carries: `{role,
content}` with text content, an assistant message's replayed `tool_calls` and a tool message's
`tool_call_id` kept beside (openai_tools.py reads those), a user message's parts beside its text
when it has images (openai_images.py); a 400 naming the message and field for anything else.

Pure functions: no database, no Redis.
"""

from __future__ import annotations

from apps.api import openai_images as images
from apps.api import openai_tools as tools
from apps.api.openai_errors import invalid, unsupported

ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
# What a replayed assistant message may carry back besides its content, read or not.
ASSISTANT_EXTRAS = ("annotations", "refusal", "audio", "function_call", "tool_calls")


def messages_of(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "`messages` must be a non-empty list of messages.")
    read = [_message(message, f"messages[{index}]") for index, message in enumerate(messages)]
    images.check_count(read)
    return read


def _message(message, where: str) -> dict:
    if not isinstance(message, dict):
        raise invalid(where, f"`{where}` must be an object with a role and content.")
    role = message.get("role")
    if role == "function":
        raise unsupported(
            f"{where}.role", "function messages (the legacy `functions`): send `tool` messages"
        )
    if role not in ROLES:
        raise invalid(
            f"{where}.role",
            f"`{where}.role` must be one of system, developer, user, assistant, tool.",
        )
    for name, value in message.items():
        if name in ("role", "content", "name"):
            continue
        if name == "tool_call_id" and role == "tool":
            continue
        if role != "assistant" or name not in ASSISTANT_EXTRAS:
            raise invalid(f"{where}.{name}", f"Unrecognized message field: {name}")
        if name == "function_call" and value:
            raise unsupported(
                f"{where}.function_call", "the legacy `function_call`: replay `tool_calls`"
            )
        if name == "audio" and value:
            raise unsupported(f"{where}.audio", "audio")
    calls = tools.calls_of(message.get("tool_calls"), where) if role == "assistant" else []
    content = message.get("content")
    # An assistant message that only calls tools has no content (null, as OpenAI returns it).
    text, parts = ("", []) if content is None and calls else _content(content, where)
    parsed: dict = {"role": ROLES[role], "content": text}
    if parts:
        if role != "user":
            raise invalid(f"{where}.content", f"Only user messages may hold images, not {role}.")
        parsed["parts"] = parts
    if calls:
        parsed["tool_calls"] = calls
    if role == "tool":
        parsed["tool_call_id"] = tools.call_id_of(message, where)
    return parsed


def _content(content, where: str) -> tuple[str, list[dict]]:
    """The text of `content`, and all its parts when it holds images (else none)."""
    if isinstance(content, str):
        return content, []
    if content is None:
        raise invalid(f"{where}.content", f"`{where}.content` must be text.")
    if not isinstance(content, list):
        raise invalid(
            f"{where}.content", f"`{where}.content` must be a string or a list of text parts."
        )
    texts, parts = [], []
    for at, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            parts.append(images.image_part(part, f"{where}.content[{at}]"))
        elif kind in ("input_audio", "file"):
            raise unsupported(f"{where}.content[{at}]", f"{kind} content parts")
        else:
            raise invalid(
                f"{where}.content[{at}]",
                f'`{where}.content` parts must be {{"type": "text", "text": ...}} or '
                '{"type": "image_url", "image_url": {"url": ...}}.',
            )
    has_images = any(part["type"] == "image_url" for part in parts)
    return "\n".join(texts), parts if has_images else []
