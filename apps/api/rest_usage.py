"""Usage and feedback in Sluice's REST API: `GET /api/v1/usage` (the caller's own: an API
key sees what it sent, a session everything of its user) and
`POST /api/v1/requests/<id>/feedback` (a vote on one of the caller's answers). Same auth as
rest.py: a session cookie with CSRF, or `Authorization: Bearer <API key>`."""

from __future__ import annotations

import orjson
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from apps.accounts.models import ApiKey
from apps.accounts.services import api_key_hash
from apps.admission.selectors import plan_for_user
from apps.api.rest import _bearer, _error, _unauthenticated, authenticate
from apps.usage import selectors, services
from apps.usage.models import Feedback

DEFAULT_DAYS = {"day": 30, "hour": 2}
MAX_DAYS = {"day": 400, "hour": 31}


@require_GET
def usage(request: HttpRequest) -> JsonResponse:
    user = authenticate(request)
    if user is None:
        return _unauthenticated()
    granularity = request.GET.get("granularity", "day")
    if granularity not in selectors.GRANULARITIES:
        return _error(400, '\'granularity\' must be "day" or "hour".')
    days = request.GET.get("days", str(DEFAULT_DAYS[granularity]))
    if not days.isdigit() or not 1 <= int(days) <= MAX_DAYS[granularity]:
        return _error(
            400,
            f"'days' must be a whole number from 1 to {MAX_DAYS[granularity]} by {granularity}.",
        )
    raw = _bearer(request)
    key = None
    if raw is not None:
        key = ApiKey.objects.filter(user=user, key_hash=api_key_hash(raw)).first()
    plan = plan_for_user(user=user)
    own = selectors.usage_for_user(user=user, plan=plan)
    series = selectors.usage_series(
        user=user,
        api_key_id=key.id if key is not None else None,
        days=int(days),
        granularity=granularity,
    )
    return JsonResponse(
        {
            "key": None if key is None else {"id": key.id, "name": key.name, "prefix": key.prefix},
            "granularity": granularity,
            "days": int(days),
            "data": [
                {
                    "start": row["period"].isoformat(),
                    "model": row["model"],
                    "requests": row["requests"],
                    "prompt_tokens": row["prompt_tokens"],
                    "cached_prompt_tokens": row["cached_tokens"],
                    "completion_tokens": row["completion_tokens"],
                }
                for row in series
            ],
            # The user's (all their keys' and the page's) use against the plan's limits.
            "plan": {
                "name": plan.name,
                "tokens_per_day": plan.tokens_per_day,
                "tokens_per_minute": plan.tokens_per_minute,
                "requests_per_minute": plan.requests_per_minute,
                "max_concurrent": plan.max_concurrent,
                "tokens_last_24h": own.last_day.tokens,
                "requests_last_24h": own.last_day.requests,
            },
        }
    )


def _feedback_input(request: HttpRequest) -> dict:
    """The vote, reasons and comment from a JSON body, or from the page's form when it posts
    without JavaScript."""
    if request.content_type == "application/json":
        try:
            body = orjson.loads(request.body or b"{}")
        except orjson.JSONDecodeError as exc:
            raise ValidationError(f"The body must be a JSON object: {exc}.") from exc
        if not isinstance(body, dict):
            raise ValidationError("The body must be a JSON object.")
        if "vote" not in body:
            raise ValidationError('Field \'vote\' is required: "up", "down" or null.')
        return body
    return {
        "vote": request.POST.get("vote") or None,
        "reasons": request.POST.getlist("reasons"),
        "comment": request.POST.get("comment", ""),
    }


@csrf_exempt  # API keys need no CSRF token; session callers are checked in authenticate()
@require_POST
def feedback(request: HttpRequest, request_id: str) -> HttpResponse:
    user = authenticate(request)
    if user is None:
        return _unauthenticated()
    # Whose answer it is before anything about the body: another user's id is only a 404.
    selectors.usage_row_get_for_user(user=user, request_id=request_id)
    try:
        vote, reasons, comment = services.feedback_clean(
            **{name: _feedback_input(request).get(name) for name in ("vote", "reasons", "comment")}
        )
    except ValidationError as exc:
        return _error(400, " ".join(exc.messages))
    stored = services.feedback_set(
        user=user, request_id=request_id, vote=vote, reasons=reasons, comment=comment
    )
    back = request.POST.get("next", "") if request.content_type != "application/json" else ""
    if back and url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
        return HttpResponseRedirect(back, status=303)
    return JsonResponse(
        {
            "request_id": request_id,
            "vote": None if stored is None else ("up" if stored.vote == Feedback.UP else "down"),
            "reasons": [] if stored is None else stored.reasons,
            "comment": "" if stored is None else stored.comment,
        }
    )
