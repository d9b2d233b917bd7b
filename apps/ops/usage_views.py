"""The admin's usage and feedback pages, with their CSV exports (staff only).

Usage: by day or hour, filtered by plan, user, model and API key; top users, tokens per
answer, the share of prompt tokens served from the engines' cache, refusals by reason beside
what was served, cost where a price is set. Feedback: the down-vote rate by model, corpus and
day, the passages behind the down-votes (each linked to its document), and recent votes.
A vote's comment is the person's own words about a conversation: only staff who may read
other people's conversations see comments, on the page or in the CSV, and only in the answer to
the reason's form (apps/accounts/read_gate.py); each shown comment is recorded for its author.
"""

from __future__ import annotations

import csv
from datetime import timedelta

from django.contrib import admin
from django.http import HttpRequest, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from apps.accounts import read_gate, services
from apps.accounts.forms import client_ip
from apps.accounts.models import ApiKey, User
from apps.admission.models import Plan
from apps.admission.selectors import plan_for_user
from apps.usage import reports
from apps.usage.selectors import GRANULARITIES, usage_for_user

MAX_DAYS = {"day": 400, "hour": 31}


def _staff(view):
    return admin.site.admin_view(view)


def _comments_reason(request: HttpRequest) -> tuple[str, read_gate.ReasonForm | None]:
    """The reason this request gave for reading comments ("" when none or not allowed), and
    the reason's form to show (None for staff who may not read comments at all)."""
    if not read_gate.may_read_others(request.user):
        return "", None
    form = read_gate.reason_form(request)
    if form.is_bound and form.is_valid():
        return form.cleaned_data[read_gate.REASON_FIELD], form
    return "", form


def _record_comment_reads(request: HttpRequest, votes, reason: str) -> None:
    """One record per person whose comment is shown (one's own comments aside)."""
    owners = [(vote.user, vote.request_id) for vote in votes if vote.comment]
    services.staff_read_record(
        reader=request.user,
        owners=[(owner, key) for owner, key in owners if owner.pk != request.user.pk],
        subject="feedback comment",
        reason=reason,
        address=client_ip(request),
    )


def usage_filter(request: HttpRequest) -> tuple[reports.UsageFilter, list[str]]:
    """The filters from the query string, and what was wrong with any (ignored, said why)."""
    query, errors = request.GET, []
    usage = reports.UsageFilter()
    granularity = query.get("granularity", "day")
    if granularity in GRANULARITIES:
        usage.granularity = granularity
    else:
        errors.append("Group by day or hour.")
    days = query.get("days", "")
    if days:
        if days.isdigit() and 1 <= int(days) <= MAX_DAYS[usage.granularity]:
            usage.days = int(days)
        else:
            errors.append(f"Days: a whole number from 1 to {MAX_DAYS[usage.granularity]}.")
    elif usage.granularity == "hour":
        usage.days = 2
    for name in ("plan", "key"):
        value = query.get(name, "")
        if value and not value.isdigit():
            errors.append(f"{name.title()}: pick one from the list.")
        elif value:
            setattr(usage, "plan_id" if name == "plan" else "api_key_id", int(value))
    username = query.get("user", "").strip()
    if username:
        usage.user = User.objects.filter(username=username).first()
        if usage.user is None:
            errors.append(f"No user {username!r}.")
    usage.model = query.get("model", "").strip()[:200]
    return usage, errors


@_staff
def usage_page(request: HttpRequest):
    usage, errors = usage_filter(request)
    context = {
        **admin.site.each_context(request),
        "title": "Usage",
        "f": usage,
        "errors": errors,
        "series": reports.series(usage),
        "totals": reports.totals(usage),
        "top_users": reports.top_users(usage),
        "by_model": reports.by_model(usage),
        "rejections": reports.rejections(usage),
        "plans": Plan.objects.order_by("name"),
        "models": reports.models_seen(),
        "keys": ApiKey.objects.filter(user=usage.user) if usage.user else [],
        "query": request.GET.urlencode(),
    }
    if usage.user is not None:
        plan = plan_for_user(user=usage.user)
        context["limits"] = usage_for_user(user=usage.user, plan=plan)
    return TemplateResponse(request, "admin/ops/usage.html", context)


class _Echo:
    def write(self, value):
        return value


def _csv(rows, name: str) -> StreamingHttpResponse:
    writer = csv.writer(_Echo())
    response = StreamingHttpResponse(
        (writer.writerow(row) for row in rows), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


@_staff
def usage_csv(request: HttpRequest):
    usage, _ = usage_filter(request)
    return _csv(reports.csv_rows(usage), f"sluice-usage-{timezone.now():%Y%m%d}.csv")


def _feedback_since(request: HttpRequest) -> tuple[int, list[str]]:
    days = request.GET.get("days", "30")
    if days.isdigit() and 1 <= int(days) <= 400:
        return int(days), []
    return 30, ["Days: a whole number from 1 to 400."]


@_staff
@require_http_methods(["GET", "POST"])
def feedback_page(request: HttpRequest):
    days, errors = _feedback_since(request)
    since = timezone.now() - timedelta(days=days)
    reason, reason_form = _comments_reason(request)
    recent = list(reports.feedback_recent(since=since))
    if reason:
        _record_comment_reads(request, recent, reason)
    return TemplateResponse(
        request,
        "admin/ops/feedback.html",
        {
            **admin.site.each_context(request),
            "title": "Answer feedback",
            "days": days,
            "errors": errors,
            "by_model": reports.feedback_by_model(since=since),
            "by_corpus": reports.feedback_by_corpus(since=since),
            "by_day": reports.feedback_by_day(since=since),
            "passages": reports.worst_passages(since=since),
            "recent": recent,
            "comments": bool(reason),
            "reason_form": reason_form,
        },
    )


@_staff
@require_http_methods(["GET", "POST"])
def feedback_csv(request: HttpRequest):
    days, _ = _feedback_since(request)
    since = timezone.now() - timedelta(days=days)
    reason, _ = _comments_reason(request)
    if reason:
        _record_comment_reads(request, reports.feedback_commented(since=since), reason)
    rows = reports.feedback_csv_rows(since=since, with_comments=bool(reason))
    return _csv(rows, f"sluice-feedback-{timezone.now():%Y%m%d}.csv")
