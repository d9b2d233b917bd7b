"""What users read when the dispatcher ends their request: said plainly, with the real reason
and when to try again."""

from __future__ import annotations

# Why a request was refused, for programs (the final event's `code`), by the metrics' reason.
REJECTION_CODES = {
    "rate": "rate_limited",
    "too_large": "too_large",
    "shed": "shed",
    "model": "model_not_allowed",
}


def human_seconds(seconds: float) -> str:
    seconds = max(1, round(seconds))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def too_large(*, tokens: int, limit: int) -> str:
    return (
        f"This request needs about {tokens} tokens, more than your plan allows at once "
        f"({limit}). Start a new conversation or ask for a shorter answer."
    )


def rate_limited(*, bucket: str, wait_s: float) -> str:
    """Refused by its plan's rate: at once, or after it was held in line past its deadline."""
    if bucket == "tpd":
        return f"You have used today's tokens for your plan. Try again in {human_seconds(wait_s)}."
    what = "requests" if bucket == "req" else "text"
    return (
        f"You are sending {what} faster than your plan allows. "
        f"Try again in {human_seconds(wait_s)}."
    )


def shed(*, retry_after: int) -> str:
    return (
        "Sluice is under heavy load and is serving other plans first. "
        f"Try again in {human_seconds(retry_after)}."
    )


def timed_out(*, waited_s: float, held_s: float = 0.0, left_s: float = 0.0) -> str:
    """No worker took it in time. When its plan's rate held it (`held_s`) for more of its
    wait than it then had left (`left_s`), the rate is what the user can act on."""
    if held_s and held_s >= left_s:
        left = human_seconds(left_s) if left_s >= 1 else "less than a second"
        return (
            f"Your plan's rate held this request for {human_seconds(held_s)}, which left it "
            f"{left} to reach a worker, and none came free in time. "
            "Send requests more slowly, or try again in a minute."
        )
    return (
        f"Sluice is very busy: your request waited {human_seconds(waited_s)} without a free "
        "worker. Please try again in a minute."
    )


def waiting_reason(*, bucket: str, wait_s: float) -> str:
    what = {"req": "requests", "tpd": "tokens per day"}.get(bucket, "tokens per minute")
    return f"Your plan's limit on {what} holds this request for about {human_seconds(wait_s)}."


def model_not_allowed(*, model: str) -> str:
    return f"Your plan does not include the model {model!r}. Choose another model."


def lost() -> str:
    return "The server running this answer stopped before it finished. Please try again."


def unreadable() -> str:
    return "Sluice could not read this request back. Please send it again."
