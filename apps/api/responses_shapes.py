"""What a Responses API client receives: the `response` object, whole, or as the stream of
events OpenAI sends (`response.created`, `response.in_progress`, the output items with their
text deltas or function-call arguments, then `response.completed`), each numbered by
`sequence_number`.

`ResponseEvents` has the methods of `openai_shapes.Chunks` that `openai_relay.StreamRelay`
calls, so a streamed response is relayed by the same code as a streamed chat completion (queue
comments, re-runs after a worker died, cancelling when the client goes away); only the words
on the wire differ.

Pure functions and a small class: no database, no Redis.
"""

from __future__ import annotations

import json

from apps.api.openai_errors import ApiError
from apps.api.responses_request import Echo


def response_id(request_id: str) -> str:
    return f"resp_{request_id}"


def usage_of(usage: dict) -> dict:
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    cached = int(usage.get("cached_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def ended_early(finish_reason: str | None) -> bool:
    """Whether the answer was cut before the model ended it: at the token cap, or (where the
    operator turned loop stopping on for the model) because it repeated itself. Either is
    `incomplete` for `max_output_tokens`, the one reason OpenAI's clients know for a cut."""
    return finish_reason in ("length", "loop")


def message_item(request_id: str, text: str | None, status: str) -> dict:
    """The assistant's message; `text` None: announced, its content still to come."""
    content = [] if text is None else [output_text(text)]
    return {
        "type": "message",
        "id": f"msg_{request_id}",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(request_id: str, index: int, call: dict, *, status: str = "completed") -> dict:
    """A function call (`call`: as worker/tool_calls.py writes it, in the chat shape)."""
    function = call["function"]
    return {
        "type": "function_call",
        "id": f"fc_{request_id}_{index}",
        "call_id": call["id"],
        "name": function["name"],
        "arguments": function["arguments"] if status == "completed" else "",
        "status": status,
    }


def output_of(request_id: str, text: str, calls: list[dict], status: str) -> list[dict]:
    """The output items of an answer: its message (when it wrote text, or made no call), then
    its calls."""
    items = [message_item(request_id, text, status)] if text or not calls else []
    items += [call_item(request_id, index, call) for index, call in enumerate(calls)]
    return items


def response_object(
    *,
    request_id: str,
    model: str,
    created: int,
    echo: Echo,
    status: str,
    output: list[dict] | None = None,
    usage: dict | None = None,
    error: dict | None = None,
) -> dict:
    """A `response`. `status`: in_progress, completed, incomplete or failed."""
    return {
        "id": response_id(request_id),
        "object": "response",
        "created_at": created,
        "status": status,
        "model": model,
        "output": output or [],
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": echo.instructions,
        "max_output_tokens": echo.max_output_tokens,
        "metadata": echo.metadata,
        "parallel_tool_calls": echo.parallel_tool_calls,
        "temperature": echo.temperature,
        "top_p": echo.top_p,
        "tool_choice": echo.tool_choice,
        "tools": echo.tools,
        "text": echo.text,
        "previous_response_id": None,
        "store": False,  # Sluice keeps no response to fetch later
        "background": False,
        "truncation": "disabled",
        "reasoning": None,
        "service_tier": "default",
        "usage": None if usage is None else usage_of(usage),
    }


def completed(
    *,
    request_id: str,
    model: str,
    created: int,
    echo: Echo,
    text: str,
    calls: list[dict],
    finish_reason: str,
    usage: dict,
) -> dict:
    """The response of an answer that ended (whole, not streamed)."""
    status = "incomplete" if ended_early(finish_reason) else "completed"
    return response_object(
        request_id=request_id,
        model=model,
        created=created,
        echo=echo,
        status=status,
        output=output_of(request_id, text, calls, status),
        usage=usage,
    )


def failure_code(error: ApiError) -> str:
    """A failed response's `error.code`, from the few OpenAI's clients know (the error's own
    code and type are beside it)."""
    if error.code == "rate_limit_exceeded":
        return error.code
    return "invalid_prompt" if 400 <= error.status < 500 else "server_error"


class ResponseEvents:
    """The SSE events of one streamed response, in OpenAI's order and numbering."""

    def __init__(self, *, request_id: str, model: str, created: int, echo: Echo) -> None:
        self.request_id = request_id
        self._fixed = {"request_id": request_id, "model": model, "created": created, "echo": echo}
        self._sequence = 0
        self._opened = False
        self._message: list[str] | None = None  # the open message's text so far
        self.output: list[dict] = []  # the items done

    def _event(self, kind: str, **fields) -> str:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n"

    def _response(self, status: str, **fields) -> dict:
        return response_object(status=status, output=list(self.output), **self._fixed, **fields)

    def _open(self) -> str:
        if self._opened:
            return ""
        self._opened = True
        created = self._event("response.created", response=self._response("in_progress"))
        return created + self._event("response.in_progress", response=self._response("in_progress"))

    def _open_message(self) -> str:
        if self._message is not None:
            return ""
        self._message = []
        at = {"output_index": len(self.output)}
        item = message_item(self.request_id, None, "in_progress")
        return self._event("response.output_item.added", item=item, **at) + self._event(
            "response.content_part.added",
            item_id=item["id"],
            content_index=0,
            part=output_text(""),
            **at,
        )

    def _close_message(self, status: str) -> str:
        if self._message is None:
            return ""
        text, self._message = "".join(self._message), None
        item = message_item(self.request_id, text, status)
        at = {"item_id": item["id"], "output_index": len(self.output)}
        out = (
            self._event("response.output_text.done", text=text, content_index=0, logprobs=[], **at)
            + self._event(
                "response.content_part.done", part=output_text(text), content_index=0, **at
            )
            + self._event("response.output_item.done", item=item, output_index=at["output_index"])
        )
        self.output.append(item)
        return out

    # -- what openai_relay.StreamRelay calls ------------------------------------------------

    def role(self, index: int = 0) -> str:
        return self._open()

    def text(self, text: str, index: int = 0, logprobs: list[dict] | None = None) -> str:
        out = self._open() + self._open_message()
        self._message.append(text)
        return out + self._event(
            "response.output_text.delta",
            item_id=f"msg_{self.request_id}",
            output_index=len(self.output),
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def calls(self, calls: list[dict], index: int = 0) -> str:
        """Each call as its own item: announced, its arguments in one delta, done."""
        out = [self._open(), self._close_message("completed")]
        for number, call in enumerate(calls):
            at = {"output_index": len(self.output)}
            started = call_item(self.request_id, number, call, status="in_progress")
            item = call_item(self.request_id, number, call)
            arguments = item["arguments"]
            out += [
                self._event("response.output_item.added", item=started, **at),
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    delta=arguments,
                    **at,
                ),
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    name=item["name"],
                    arguments=arguments,
                    **at,
                ),
                self._event("response.output_item.done", item=item, **at),
            ]
            self.output.append(item)
        return "".join(out)

    def finish(self, finish_reason: str, usage: dict) -> str:
        status = "incomplete" if ended_early(finish_reason) else "completed"
        out = self._open()
        if not self.output and self._message is None:  # no text, no call: an empty message
            out += self._open_message()
        out += self._close_message(status)
        final = self._response(status, usage=usage)
        return out + self._event(f"response.{status}", response=final)

    def error(self, error: ApiError) -> str:
        """The end of a stream whose answer failed after the status line was sent."""
        failure = {
            "code": failure_code(error),
            "message": error.message,
            "param": error.param,
            "type": error.type,
        }
        failed = self._response("failed", error=failure)
        return self._open() + self._event("response.failed", response=failed)
