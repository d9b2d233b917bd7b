"""`{% own_usage %}`: the signed-in user's usage against their plan, for the profile page
(accounts renders the page but may not import usage: the block comes from here);
`{% user_usage %}`: the same for staff, on a user's admin page (for the same reason);
`{% feedback_votes %}`: the votes the chat page shows on its answers' thumbs."""

from __future__ import annotations

from django import template

from apps.admission.selectors import plan_for_user
from apps.usage.models import Feedback
from apps.usage.selectors import feedback_votes as votes_for
from apps.usage.selectors import usage_for_user

register = template.Library()


@register.inclusion_tag("usage/_own.html", takes_context=True)
def own_usage(context) -> dict:
    user = context["request"].user
    if not user.is_authenticated:
        return {}
    return {"u": usage_for_user(user=user, plan=plan_for_user(user=user))}


@register.inclusion_tag("usage/_limits.html")
def user_usage(user) -> dict:
    """`user`'s use against their plan, with a link to the usage page for the rest."""
    return {
        "who": user,
        "limits": usage_for_user(user=user, plan=plan_for_user(user=user)),
        "details": True,
    }


@register.simple_tag(takes_context=True)
def feedback_votes(context, messages) -> dict[str, str]:
    """{request id: "up" | "down"} for the answers on the page the user voted on."""
    user = context["request"].user
    ids = [m.request_id for m in messages if getattr(m, "request_id", None)]
    return votes_for(user=user, request_ids=ids) if ids and user.is_authenticated else {}


@register.filter
def vote_of(votes: dict[str, str], request_id: str | None) -> str:
    return votes.get(request_id or "", "") if votes else ""


@register.simple_tag
def feedback_reasons() -> list[tuple[str, str]]:
    return list(Feedback.Reason.choices)
