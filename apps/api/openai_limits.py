"""The `x-ratelimit-*` headers OpenAI's clients read, from the user's plan and its buckets in
Redis (apps/admission/buckets.lua keeps each level scaled by its window: see there)."""

from __future__ import annotations

from apps.admission.buckets import Bucket, plan_buckets
from apps.admission.models import Plan
from core.redis_client import get_redis, keys


def duration(ms: float) -> str:
    """OpenAI's way of writing a reset time: "120ms", "6s", "1m30s", "2h0m0s"."""
    if ms < 1000:
        return f"{max(0, round(ms))}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, seconds = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{seconds}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes}m{seconds}s"


def bucket_levels(user_id: int | str, plan: Plan) -> dict[str, tuple[float, float]]:
    """Each bucket's (units left now, ms until it is full again), as the bucket script would
    refill it at Redis's clock."""
    buckets = plan_buckets(plan, tokens=0)
    fields = [f"{b.name}:{part}" for b in buckets for part in ("l", "t")]
    pipe = get_redis().pipeline(transaction=False)
    pipe.time()
    pipe.hmget(keys().bucket(str(user_id)), fields)
    (seconds, micros), stored = pipe.execute()
    now = seconds * 1000 + micros // 1000
    return {b.name: _level(b, stored[2 * i], stored[2 * i + 1], now) for i, b in enumerate(buckets)}


def _level(bucket: Bucket, level, stamp, now: int) -> tuple[float, float]:
    capacity = bucket.capacity * bucket.window_ms
    if level is None or stamp is None:
        return float(bucket.capacity), 0.0
    scaled = min(capacity, float(level) + max(0, now - int(float(stamp))) * bucket.refill)
    return scaled / bucket.window_ms, (capacity - scaled) / bucket.refill


def rate_limit_headers(user_id: int | str, plan: Plan) -> dict[str, str]:
    levels = bucket_levels(user_id, plan)
    requests_left, requests_reset = levels["req"]
    # The tighter of the two token buckets is what the caller may spend now.
    tokens_left, tokens_reset = min(levels["tpm"], levels["tpd"])
    return {
        "x-ratelimit-limit-requests": str(plan.requests_per_minute),
        "x-ratelimit-limit-tokens": str(plan.tokens_per_minute),
        "x-ratelimit-remaining-requests": str(max(0, int(requests_left))),
        "x-ratelimit-remaining-tokens": str(max(0, int(tokens_left))),
        "x-ratelimit-reset-requests": duration(requests_reset),
        "x-ratelimit-reset-tokens": duration(tokens_reset),
    }
