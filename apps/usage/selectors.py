"""Reads of a person's own usage and feedback: the profile page, the API, the export."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, F, Q, Sum
from django.db.models.functions import TruncDay, TruncHour
from django.http import Http404
from django.utils import timezone

from apps.accounts.models import User
from apps.admission.models import Plan
from apps.usage.models import Feedback, HourlyUsage, RequestUsage

TOKEN_SUMS = {
    "requests": Sum("requests"),
    "prompt_tokens": Sum("prompt_tokens"),
    "cached_tokens": Sum("cached_tokens"),
    "completion_tokens": Sum("completion_tokens"),
}
GRANULARITIES = {"hour": TruncHour, "day": TruncDay}
MAX_DAYS = 400


def usage_row_get_for_user(*, user: User, request_id: str) -> RequestUsage:
    """The usage row of one of the user's answers; Http404 for anyone else's (or an answer
    not recorded yet, or past USAGE_REQUEST_DAYS)."""
    row = RequestUsage.objects.filter(user=user, request_id=request_id[:64]).first()
    if row is None:
        raise Http404("No such answer.")
    return row


@dataclass
class Totals:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    @property
    def tokens(self) -> int:
        """What a plan's token limits count: prompt and answer."""
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def of(cls, sums: dict) -> Totals:
        return cls(**{name: sums.get(name) or 0 for name in TOKEN_SUMS})


@dataclass
class OwnUsage:
    """What the profile page shows: the last day's and this month's use against the plan."""

    plan: Plan
    last_day: Totals
    month: Totals
    last_minute_tokens: int

    @property
    def day_share(self) -> int:
        """Percent of the plan's daily tokens used in the last 24 hours (at most 100)."""
        limit = self.plan.tokens_per_day or 0
        return min(100, round(100 * self.last_day.tokens / limit)) if limit else 0


def usage_for_user(*, user: User, plan: Plan, now: datetime | None = None) -> OwnUsage:
    """The last 24 hours from the per-request rows (the plan's daily tokens refill
    continuously, so that is the window they limit); the calendar month from the sums."""
    now = now or timezone.now()
    rows = RequestUsage.objects.filter(user=user, created__gte=now - timedelta(days=1))
    recent = Q(created__gte=now - timedelta(minutes=1))
    # Aliases unlike the columns' names: Django refuses an aggregate named as a column that
    # another aggregate of the same query reads.
    sums = rows.aggregate(
        n=Count("id"),
        prompt=Sum("prompt_tokens"),
        cached=Sum("cached_tokens"),
        completion=Sum("completion_tokens"),
        minute=Sum(F("prompt_tokens") + F("completion_tokens"), filter=recent),
    )
    last_day = {
        "requests": sums["n"],
        "prompt_tokens": sums["prompt"],
        "cached_tokens": sums["cached"],
        "completion_tokens": sums["completion"],
    }
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    month = HourlyUsage.objects.filter(user=user, hour__gte=month_start).aggregate(**TOKEN_SUMS)
    return OwnUsage(
        plan=plan,
        last_day=Totals.of(last_day),
        month=Totals.of(month),
        last_minute_tokens=sums["minute"] or 0,
    )


def usage_series(
    *,
    user: User,
    api_key_id: int | None = None,
    days: int = 30,
    granularity: str = "day",
    now: datetime | None = None,
) -> list[dict]:
    """The user's usage by period and model over the last `days` (only what `api_key_id`
    sent, when given), oldest first."""
    now = now or timezone.now()
    rows = HourlyUsage.objects.filter(user=user, hour__gte=now - timedelta(days=days))
    if api_key_id is not None:
        rows = rows.filter(api_key_id=api_key_id)
    period = GRANULARITIES[granularity]("hour")
    return list(
        rows.annotate(period=period)
        .values("period", "model")
        .annotate(**TOKEN_SUMS)
        .order_by("period", "model")
    )


def feedback_for_user(*, user: User, conversation_ids: list[int] | None = None) -> list[dict]:
    """The user's votes, as their export shows them (only on these conversations, if given)."""
    rows = Feedback.objects.filter(user=user)
    if conversation_ids is not None:
        rows = rows.filter(conversation_id__in=conversation_ids)
    return [
        {
            "request_id": f.request_id,
            "vote": "up" if f.vote == Feedback.UP else "down",
            "reasons": f.reasons,
            "comment": f.comment,
            "updated": f.updated.isoformat(),
        }
        for f in rows.order_by("updated")
    ]


def feedback_votes(*, user: User, request_ids: list[str]) -> dict[str, str]:
    """{request id: "up" | "down"} for those the user voted on: the page shows its thumbs."""
    rows = Feedback.objects.filter(user=user, request_id__in=request_ids)
    return {
        request_id: ("up" if vote == Feedback.UP else "down")
        for request_id, vote in rows.values_list("request_id", "vote")
    }
