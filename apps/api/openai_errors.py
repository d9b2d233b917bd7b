"""Errors as OpenAI's API reports them: `{"error": {message, type, param, code}}` with the status
its clients expect, and the request body read as strict JSON."""

from __future__ import annotations

import orjson
from django.http import JsonResponse

from contract.capabilities import describe


class ApiError(Exception):
    """An error as OpenAI's API reports it; `response()` is what the client receives."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JsonResponse:
        response = JsonResponse(self.body(), status=self.status)
        for name, value in self.headers.items():
            response[name] = value
        return response


def invalid(param: str | None, message: str, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unsupported(param: str, what: str) -> ApiError:
    return invalid(param, f"Sluice does not support {what}.", code="unsupported_parameter")


def not_on_model(model: str, param: str, capability: str) -> ApiError:
    """A parameter the chosen model's workers cannot serve (contract/capabilities.py)."""
    return invalid(
        param,
        f"The model `{model or '(default)'}` does not support {describe(capability)}, so "
        f"`{param}` cannot be honoured. GET /v1/models lists what each model supports.",
        code="unsupported_parameter",
    )


def bad_key() -> ApiError:
    return ApiError(
        401,
        "Incorrect API key provided. Send `Authorization: Bearer <key>` with a "
        "Sluice API key (from your profile page).",
        code="invalid_api_key",
    )


def model_not_found(model: str) -> ApiError:
    # The same answer for a model that exists nowhere and one the plan does not include.
    return ApiError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def no_worker(model: str, *, retry_after: int = 30) -> ApiError:
    return ApiError(
        503,
        f"No worker serves the model `{model}` right now. Please try again shortly.",
        type="server_error",
        code="model_unavailable",
        headers={"Retry-After": str(retry_after)},
    )


def context_room(*, window: int, prompt_tokens: int, asked: int | None) -> int:
    """The tokens left for the answer beside the messages, or ApiError 400 in OpenAI's own
    words (client libraries recognise them: LiteLLM raises ContextWindowExceededError).

    As at OpenAI, a caller who asked for a length (`max_tokens`) that does not fit beside the
    messages is refused rather than given less than it asked; one who asked for none gets the
    room there is."""
    if prompt_tokens >= window:
        raise invalid(
            "messages",
            f"This model's maximum context length is {window} tokens. However, your messages "
            f"resulted in {prompt_tokens} tokens. Please reduce the length of the messages.",
            code="context_length_exceeded",
        )
    if asked is not None and prompt_tokens + asked > window:
        raise invalid(
            "messages",
            f"This model's maximum context length is {window} tokens. However, you requested "
            f"{prompt_tokens + asked} tokens ({prompt_tokens} in the messages, {asked} in the "
            "completion). Please reduce the length of the messages or completion.",
            code="context_length_exceeded",
        )
    return window - prompt_tokens


def body_of(raw: bytes) -> dict:
    """The request's JSON object. Strict JSON (orjson): NaN, infinities and a lone UTF-16
    surrogate escape (text no database or model can take) are refused here, with the reason."""
    try:
        body = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError as exc:
        raise invalid(None, f"The body must be JSON: {exc}.") from None
    if not isinstance(body, dict):
        raise invalid(None, "The body must be a JSON object.")
    return body
