"""How the dispatcher ends a request it never hands to a worker (rejected, timed out, cancelled
while queued), and the messages users read: said plainly, with when to try again."""

from __future__ import annotations

from redis.client import Pipeline

from worker import protocol
from worker.protocol import Completion, Keys, State, Usage


def human_seconds(seconds: float) -> str:
    seconds = max(1, round(seconds))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def too_large(*, tokens: int, limit: int) -> str:
    return (f"This request needs about {tokens} tokens, more than your plan allows at once "
            f"({limit}). Start a new conversation or ask for a shorter answer.")  # fmt: skip


def rate_limited(*, bucket: str, wait_s: float) -> str:
    if bucket == "tpd":
        return f"You have used today's tokens for your plan. Try again in {human_seconds(wait_s)}."
    what = "requests" if bucket == "req" else "text"
    return (f"You are sending {what} faster than your plan allows. "
            f"Try again in {human_seconds(wait_s)}.")  # fmt: skip


def shed(*, retry_after: int) -> str:
    return ("Sluice is under heavy load and is serving other plans first. "
            f"Try again in {human_seconds(retry_after)}.")  # fmt: skip


def timed_out(*, waited_s: float) -> str:
    return (f"Sluice is very busy: your request waited {human_seconds(waited_s)} without a free "
            "worker. Please try again in a minute.")  # fmt: skip


def waiting_reason(*, bucket: str, wait_s: float) -> str:
    what = {"req": "requests", "tpd": "tokens per day"}.get(bucket, "tokens per minute")
    return f"Your plan's limit on {what} holds this request for about {human_seconds(wait_s)}."


def request_end(
    pipe: Pipeline,
    keys: Keys,
    record: dict,
    *,
    state: State,
    error: str = "",
    retry_after: int | None = None,
) -> None:
    """Queues on `pipe` what the runner's finish_request writes: the final event (with
    retry_after), the request's end state and a done record, so the browser, the API and the
    recorder all see the end."""
    completion = Completion(
        id=record["id"], user_id=record["user"], conversation_id=record["conv"], state=state,
        text="", usage=Usage(), error=error, prompt_tokens_estimate=record.get("pte", 0),
        max_tokens=record.get("max_tokens", 0),
    )  # fmt: skip
    event = protocol.final_event(completion)
    if retry_after is not None:
        event["retry_after"] = str(int(retry_after))
    out_key = keys.output(completion.id)
    pipe.xadd(out_key, event, maxlen=protocol.OUTPUT_MAXLEN, approximate=True)
    pipe.expire(out_key, protocol.OUTPUT_TTL_SECONDS)
    request_key = keys.request(completion.id)
    pipe.hset(request_key, mapping={"state": state, "updated_ms": protocol.now_ms(),
                                    "error": error})  # fmt: skip
    pipe.expire(request_key, protocol.REQUEST_TTL_SECONDS)
    pipe.xadd(keys.done, completion.to_fields(), maxlen=protocol.DONE_MAXLEN, approximate=True)
