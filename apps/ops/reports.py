"""People report an answer to staff: the form under each stored answer, and the writes of the
admin's queue (apps/ops/admin.py)."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from apps.accounts.models import User
from apps.chat.models import Message
from apps.ops.models import Report


class ReportForm(forms.Form):
    category = forms.ChoiceField(
        label="What is wrong with it?", choices=Report.Category.choices, widget=forms.RadioSelect
    )
    details = forms.CharField(
        label="Anything staff should know (optional)",
        required=False,
        max_length=1000,
        widget=forms.Textarea(attrs={"rows": 3, "maxlength": 1000}),
    )


def answer_get_for_user(*, user: User, message_id: int) -> Message:
    """One of `user`'s answers; Http404 for anyone else's (or a question)."""
    return get_object_or_404(
        Message.objects.select_related("conversation"),
        id=message_id,
        role=Message.Role.ASSISTANT,
        conversation__owner=user,
    )


@transaction.atomic
def report_create(*, reporter: User, answer: Message, category: str, details: str) -> Report:
    """Files the report with a copy of the answer and the question before it; a second
    report of the same answer by the same person returns the first."""
    question = (
        Message.objects.filter(
            conversation_id=answer.conversation_id, role=Message.Role.USER, id__lt=answer.id
        )
        .order_by("-id")
        .values_list("text", flat=True)
        .first()
    )
    report, _ = Report.objects.get_or_create(
        reporter=reporter,
        message_id=answer.id,
        defaults={
            "conversation_id": answer.conversation_id,
            "request_id": answer.request_id or "",
            "model": answer.conversation.model,
            "reported_text": answer.text,
            "context": question or "",
            "category": category,
            "details": details,
        },
    )
    return report


def reports_close(*, reports, status: str, by: User) -> int:
    """Closes open reports as actioned or dismissed; returns how many."""
    return reports.filter(status=Report.Status.OPEN).update(
        status=status, handled=timezone.now(), handled_by=by
    )


@login_required
@require_http_methods(["GET", "POST"])
def report_answer(request: HttpRequest, message_id: int) -> HttpResponse:
    answer = answer_get_for_user(user=request.user, message_id=message_id)
    form = ReportForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        report_create(reporter=request.user, answer=answer, **form.cleaned_data)
        messages.success(request, "Thank you. Staff will look at this answer.")
        return redirect("chat:conversation", id=answer.conversation_id)
    return render(request, "ops/report.html", {"form": form, "answer": answer})
