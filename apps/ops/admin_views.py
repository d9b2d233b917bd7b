"""The operations page and the request inspector, in the admin (staff only).

The page renders once; its live part (`live`) is fetched again every two seconds by htmx and
carries the samples the charts have not seen yet (`since`), so a refresh reads a few keys and
not the hour of samples again.
"""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.views.decorators.http import require_POST

from apps.accounts import read_gate
from apps.admission.selectors import estimate_figures
from apps.chat.models import MemoryWriter, Message
from apps.ops import dashboard, inspector
from contract import transitions
from core.redis_client import get_redis, keys

REQUEST_ID_MAX = 64


def _context(request, title: str) -> dict:
    return {**admin.site.each_context(request), "title": title}


def _staff(view):
    """Staff only (the admin's login otherwise), as every admin page."""
    return admin.site.admin_view(view)


@_staff
def page(request):
    snapshot = dashboard.gather()
    return TemplateResponse(
        request,
        "admin/ops/page.html",
        {
            **_context(request, "Operations"),
            "s": snapshot,
            "estimates": estimate_figures(service=True),
            "memory_writers": MemoryWriter.objects.order_by("model"),
        },
    )


@_staff
def live(request):
    since = request.GET.get("since", "")
    if since and not _is_stream_id(since):
        since = ""
    snapshot = dashboard.gather(since=since)
    estimates = estimate_figures(service=True)
    return TemplateResponse(request, "admin/ops/live.html", {"s": snapshot, "estimates": estimates})


@_staff
def request_view(request, request_id: str = ""):
    request_id = (request_id or request.GET.get("id", "")).strip()
    if request.GET.get("id") and request_id:
        return redirect("ops:request", request_id=request_id[:REQUEST_ID_MAX])
    context = _context(request, f"Request {request_id}" if request_id else "Request inspector")
    if request_id:
        context["t"] = inspector.timeline(request_id[:REQUEST_ID_MAX])
    context["may_read"] = read_gate.may_read_others(request.user)
    return TemplateResponse(request, "admin/ops/request.html", context)


@_staff
def request_text(request, request_id: str):
    """A request's question and stored answer: another person's words, so only for staff who
    may read conversations, after a reason (recorded; a grant of its conversation covers it)."""
    read_gate.require_permission(request)
    answer = (
        Message.objects.select_related("conversation__owner")
        .filter(request_id=request_id[:REQUEST_ID_MAX])
        .first()
    )
    if answer is None:
        raise Http404("No answer was stored under this request.")
    conversation = answer.conversation
    refused = read_gate.gate(
        request,
        owner=conversation.owner,
        subject="request",
        subject_id=answer.request_id,
        what=f"question and answer of request {answer.request_id}",
        covered_by=(("conversation", conversation.pk),),
    )
    if refused is not None:
        return refused
    question = (
        conversation.messages.filter(role=Message.Role.USER, created__lte=answer.created)
        .exclude(pk=answer.pk)
        .order_by("-created", "-id")
        .first()
    )
    context = _context(request, f"Request {answer.request_id}: question and answer")
    context.update(request_id=answer.request_id, question=question, answer=answer)
    return TemplateResponse(request, "admin/ops/request_text.html", context)


@_staff
@require_POST
def dead_letter(request, entry_id: str, action: str):
    if not request.user.is_superuser and not request.user.has_perm("admission.change_plan"):
        raise PermissionDenied
    if not _is_stream_id(entry_id) or action not in ("retry", "discard"):
        raise PermissionDenied
    k = keys()
    client = get_redis()
    entries = client.xrange(k.dead, entry_id, entry_id)
    if not entries:
        messages.warning(request, f"Dead letter {entry_id} is no longer there.")
        return redirect(reverse("ops:page") + "#dead")
    fields = entries[0][1]
    pipe = client.pipeline(transaction=True)
    if action == "retry":
        target = dashboard.retry_target(k, fields)
        try:
            original = json.loads(fields.get("fields") or "{}")
        except ValueError:
            original = None
        if target is None or not isinstance(original, dict) or not original:
            messages.error(request, f"Dead letter {entry_id} cannot be retried.")
            return redirect(reverse("ops:page") + "#dead")
        # The web's deadline for Redis to take an admission entry passed long ago.
        original.pop("submit_by_ms", None)
        retried = {str(name): str(value) for name, value in original.items()}
        transitions.dead_letter_retried(pipe, k, entry_id, stream=target, fields=retried)
    else:
        transitions.dead_letter_discarded(pipe, k, entry_id)
    pipe.execute()
    done = "put back on its stream" if action == "retry" else "discarded"
    messages.success(request, f"Dead letter {entry_id} {done}.")
    return redirect(reverse("ops:page") + "#dead")


def _is_stream_id(value: str) -> bool:
    first, _, second = value.partition("-")
    return first.isdigit() and (not second or second.isdigit()) and len(value) < 40
