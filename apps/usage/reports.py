"""What the admin's usage and feedback pages read: the hourly sums filtered and grouped, and
the votes by model, corpus, day and passage. Reads only; staff views call them."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import connection
from django.db.models import Count, F, Q, QuerySet, Sum
from django.db.models.functions import TruncDay
from django.utils import timezone

from apps.accounts.models import User
from apps.rag.models import Chunk, Corpus
from apps.usage.models import Feedback, HourlyUsage, ModelPrice, Outcome
from apps.usage.selectors import GRANULARITIES, TOKEN_SUMS

MILLION = Decimal(1_000_000)
# The sums under names unlike the columns': Django refuses an aggregate named as a column that
# another aggregate of the same query reads (`rejected` below reads `requests`).
SUMS = {f"sum_{name}": value for name, value in TOKEN_SUMS.items()}


def _named(row: dict) -> dict:
    return {name.removeprefix("sum_"): value for name, value in row.items()}


@dataclass
class UsageFilter:
    """The page's filters, as the query string gives them (each already checked)."""

    days: int = 7
    granularity: str = "day"
    plan_id: int | None = None
    user: User | None = None
    model: str = ""
    api_key_id: int | None = None
    now: datetime = field(default_factory=timezone.now)

    @property
    def since(self) -> datetime:
        return self.now - timedelta(days=self.days)

    def rows(self) -> QuerySet[HourlyUsage]:
        rows = HourlyUsage.objects.filter(hour__gte=self.since)
        if self.plan_id is not None:
            rows = rows.filter(plan_id=self.plan_id)
        if self.user is not None:
            rows = rows.filter(user=self.user)
        if self.model:
            rows = rows.filter(model=self.model)
        if self.api_key_id is not None:
            rows = rows.filter(api_key_id=self.api_key_id)
        return rows


def _served(rows: QuerySet) -> QuerySet:
    return rows.exclude(outcome=Outcome.REJECTED)


def series(usage: UsageFilter) -> list[dict]:
    """Per period: answers, tokens, cached prompt tokens and rejections, oldest first."""
    period = GRANULARITIES[usage.granularity]("hour")
    rows = (
        usage.rows()
        .annotate(period=period)
        .values("period")
        .annotate(**SUMS, rejected=Sum("requests", filter=Q(outcome=Outcome.REJECTED)))
        .order_by("period")
    )
    return [_named(row) for row in rows]


def totals(usage: UsageFilter) -> dict:
    sums = _served(usage.rows()).aggregate(
        **SUMS,
        done=Sum("requests", filter=Q(outcome=Outcome.DONE)),
        done_completion=Sum("completion_tokens", filter=Q(outcome=Outcome.DONE)),
    )
    sums = {name: value or 0 for name, value in _named(sums).items()}
    sums["cache_share"] = (
        round(100 * sums["cached_tokens"] / sums["prompt_tokens"], 1)
        if sums["prompt_tokens"]
        else 0
    )
    sums["tokens_per_answer"] = round(sums["done_completion"] / sums["done"]) if sums["done"] else 0
    sums["prompt_per_answer"] = (
        round(sums["prompt_tokens"] / sums["requests"]) if sums["requests"] else 0
    )
    return sums


def top_users(usage: UsageFilter, *, limit: int = 10) -> list[dict]:
    rows = (
        _served(usage.rows())
        .values("user_id", "user__username")
        .annotate(**SUMS, tokens=Sum(F("prompt_tokens") + F("completion_tokens")))
        .order_by("-tokens", "user_id")[:limit]
    )
    return [_named(row) for row in rows]


def by_model(usage: UsageFilter) -> list[dict]:
    """Per model: tokens, and their cost where the operator set a price."""
    prices = {p.model: p for p in ModelPrice.objects.all()}
    rows = [
        _named(row)
        for row in _served(usage.rows())
        .values("model")
        .annotate(**SUMS)
        .order_by("-sum_prompt_tokens")
    ]
    for row in rows:
        row["cost"] = cost(prices.get(row["model"]), row)
        row["currency"] = prices[row["model"]].currency if row["model"] in prices else ""
    return rows


def cost(price: ModelPrice | None, row: dict) -> Decimal | None:
    if price is None:
        return None
    cached = row["cached_tokens"] or 0
    fresh = (row["prompt_tokens"] or 0) - cached
    cached_price = price.prompt if price.cached_prompt is None else price.cached_prompt
    total = (
        fresh * price.prompt
        + cached * cached_price
        + (row["completion_tokens"] or 0) * price.completion
    )
    return (total / MILLION).quantize(Decimal("0.0001"))


def rejections(usage: UsageFilter) -> dict:
    """Refusals by reason, beside what was served in the same window: what the limits
    protected."""
    rows = usage.rows()
    reasons = list(
        rows.filter(outcome=Outcome.REJECTED)
        .values("reason")
        .annotate(count=Sum("requests"))
        .order_by("-count")
    )
    served = _served(rows).aggregate(count=Sum("requests"))["count"] or 0
    return {"reasons": reasons, "served": served}


CSV_COLUMNS = (
    "hour",
    "user_id",
    "plan_id",
    "api_key_id",
    "model",
    "kind",
    "outcome",
    "reason",
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "wall_ms",
)


def csv_rows(usage: UsageFilter):
    """The filtered hourly sums as CSV rows, header first (streamed: a year is many rows)."""
    yield CSV_COLUMNS
    for row in usage.rows().order_by("hour", "user_id").values_list(*CSV_COLUMNS).iterator():
        yield [value.isoformat() if isinstance(value, datetime) else value for value in row]


# -- feedback ---------------------------------------------------------------------------------


def _down_rate(rows: QuerySet) -> QuerySet:
    return rows.annotate(
        votes=Count("id"), down=Count("id", filter=Q(vote=Feedback.DOWN))
    ).order_by("-down", "-votes")


def feedback_by_model(*, since: datetime) -> list[dict]:
    return _rated(_down_rate(Feedback.objects.filter(updated__gte=since).values("model")))


def feedback_by_day(*, since: datetime) -> list[dict]:
    rows = (
        Feedback.objects.filter(updated__gte=since)
        .annotate(day=TruncDay("updated"))
        .values("day")
        .annotate(votes=Count("id"), down=Count("id", filter=Q(vote=Feedback.DOWN)))
        .order_by("day")
    )
    return _rated(rows)


def _rated(rows) -> list[dict]:
    rows = list(rows)
    for row in rows:
        row["rate"] = round(100 * row["down"] / row["votes"]) if row["votes"] else 0
    return rows


def _unnested(column: str, *, since: datetime, limit: int) -> list[tuple[int, int, int]]:
    """(id, votes, down-votes) for each id in the array `column` of recent feedback."""
    table = Feedback._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT item, count(*), count(*) FILTER (WHERE vote = %s)
            FROM {table}, unnest({column}) AS item
            WHERE updated >= %s
            GROUP BY item ORDER BY 3 DESC, 2 DESC, item LIMIT %s
            """,
            [Feedback.DOWN, since, limit],
        )
        return cursor.fetchall()


def feedback_by_corpus(*, since: datetime) -> list[dict]:
    rows = _unnested("corpora", since=since, limit=50)
    names = dict(Corpus.objects.filter(id__in=[r[0] for r in rows]).values_list("id", "name"))
    return _rated(
        {"corpus_id": i, "name": names.get(i, f"deleted corpus #{i}"), "votes": v, "down": d}
        for i, v, d in rows
    )


def worst_passages(*, since: datetime, limit: int = 20) -> list[dict]:
    """The passages cited by the most down-voted answers, with their document and corpus, so
    an admin can open and fix or remove them."""
    rows = [r for r in _unnested("passages", since=since, limit=limit) if r[2]]
    chunks = {
        c.id: c
        for c in Chunk.objects.filter(id__in=[r[0] for r in rows]).select_related(
            "document", "corpus"
        )
    }
    return [
        {"chunk": chunks.get(chunk_id), "chunk_id": chunk_id, "votes": votes, "down": down}
        for chunk_id, votes, down in rows
    ]


def feedback_recent(*, since: datetime, limit: int = 50) -> QuerySet[Feedback]:
    return (
        Feedback.objects.filter(updated__gte=since)
        .select_related("user")
        .order_by("-updated")[:limit]
    )


def feedback_commented(*, since: datetime) -> QuerySet[Feedback]:
    """Votes with a comment, with their authors: whose words a CSV with comments holds."""
    return Feedback.objects.filter(updated__gte=since).exclude(comment="").select_related("user")


FEEDBACK_CSV_COLUMNS = (
    "updated",
    "request_id",
    "user_id",
    "vote",
    "reasons",
    "model",
    "plan_id",
    "kind",
    "finish_reason",
    "prompt_tokens",
    "corpora",
    "passages",
)


def feedback_csv_rows(*, since: datetime, with_comments: bool):
    """Votes as CSV rows, header first; comments only for staff who may read conversations."""
    columns = FEEDBACK_CSV_COLUMNS + (("comment",) if with_comments else ())
    yield columns
    rows = Feedback.objects.filter(updated__gte=since).order_by("updated").values_list(*columns)
    for row in rows.iterator():
        yield [
            value.isoformat()
            if isinstance(value, datetime)
            else " ".join(map(str, value))
            if isinstance(value, list)
            else value
            for value in row
        ]


def models_seen() -> list[str]:
    """Models with usage in the last 90 days, for the page's filter."""
    since = timezone.now() - timedelta(days=90)
    return list(
        HourlyUsage.objects.filter(hour__gte=since)
        .exclude(model="")
        .values_list("model", flat=True)
        .distinct()
        .order_by("model")
    )
