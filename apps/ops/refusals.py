"""Who the rate limits refuse most: from the hourly usage sums the recorder writes for every
refusal (outcome "rejected", with admission's reason code), ranked per person, beside what
they were served. A person refused far more than served is one to look at (and maybe suspend,
the link beside them)."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin
from django.db.models import Max, Q, Sum
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone

from apps.admission.outcomes import REJECTION_CODES
from apps.usage.models import HourlyUsage, Outcome

# Refusals by the person's own plan: its rates and daily tokens, and its size per request.
# Shedding under load is the service's doing, shown apart and not ranked on.
LIMIT_CODES = (REJECTION_CODES["rate"], REJECTION_CODES["too_large"])
SHED_CODE = REJECTION_CODES["shed"]
MAX_DAYS = 90


def refused_most(*, days: int, limit: int = 50) -> list[dict]:
    """People with refusals by their limits in the last `days`, most refused first."""
    since = timezone.now() - timedelta(days=days)
    limited = Q(outcome=Outcome.REJECTED, reason__in=LIMIT_CODES)
    rows = (
        HourlyUsage.objects.filter(hour__gte=since)
        .values("user_id", "user__username")
        .annotate(
            rate_limited=Sum("requests", filter=Q(limited, reason=REJECTION_CODES["rate"])),
            too_large=Sum("requests", filter=Q(limited, reason=REJECTION_CODES["too_large"])),
            refused=Sum("requests", filter=limited),
            shed=Sum("requests", filter=Q(outcome=Outcome.REJECTED, reason=SHED_CODE)),
            served=Sum("requests", filter=~Q(outcome=Outcome.REJECTED)),
            last_refused=Max("hour", filter=limited),
        )
        .filter(refused__gt=0)
        .order_by("-refused", "user_id")[:limit]
    )
    found = []
    for row in rows:
        row = {name: (0 if value is None else value) for name, value in row.items()}
        asked = row["refused"] + row["served"] + row["shed"]
        row["share"] = round(100 * row["refused"] / asked) if asked else 0
        found.append(row)
    return found


@admin.site.admin_view
def refused_page(request: HttpRequest) -> TemplateResponse:
    days, error = 7, ""
    asked = request.GET.get("days", "")
    if asked:
        if asked.isdigit() and 1 <= int(asked) <= MAX_DAYS:
            days = int(asked)
        else:
            error = f"Days: a whole number from 1 to {MAX_DAYS}."
    context = {
        **admin.site.each_context(request),
        "title": "Refused most by the limits",
        "days": days,
        "error": error,
        "rows": refused_most(days=days),
    }
    return TemplateResponse(request, "admin/ops/refused.html", context)
