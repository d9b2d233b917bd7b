"""Staff reads of what another person wrote: a permission of its own, a reason before the
words are shown, and a record of every read (StaffRead, shown to the person on their privacy
page).

Staff status reads nobody's conversations. The permission READ_PERMISSION does, and even then
every page that shows another person's words first asks why; the reason and the read are
recorded before anything is shown. Superusers hold every permission, so they may read, but they
are asked and recorded like anyone. A person reading their own words is not asked.

A reason opens that one object (and what it contains: a conversation's messages) in the
reader's session for GRANT_SECONDS, so the admin's pages can be used; one record stands for
that window. Pages that show many people's words at once (the feedback page's comments) show
them only in the answer to the reason's form and record one row per person each time.
"""

from __future__ import annotations

import time

from django import forms
from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse

from apps.accounts import services
from apps.accounts.forms import client_ip
from apps.accounts.models import User

READ_PERMISSION = "chat.read_others_conversations"
REASON_FIELD = "staff_read_reason"
SESSION_KEY = "staff_read_grants"


def grant_seconds() -> int:
    return settings.STAFF_READ_GRANT_SECONDS


class ReasonForm(forms.Form):
    staff_read_reason = forms.CharField(
        label="Why do you need to read this?",
        min_length=10,
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 3, "maxlength": 500}),
        help_text="Recorded with your name, and shown to the person on their privacy page.",
    )


def may_read_others(user) -> bool:
    return bool(user.is_active and user.is_staff and user.has_perm(READ_PERMISSION))


def require_permission(request: HttpRequest) -> None:
    if not may_read_others(request.user):
        raise PermissionDenied("Reading other people's conversations needs its own permission.")


def reason_form(request: HttpRequest) -> ReasonForm:
    """The reason's form, bound when this request posted one."""
    if request.method == "POST" and REASON_FIELD in request.POST:
        return ReasonForm(request.POST)
    return ReasonForm()


def _grants(request: HttpRequest) -> dict[str, float]:
    now = time.time()
    grants = request.session.get(SESSION_KEY) or {}
    return {key: until for key, until in grants.items() if until > now}


def _key(subject: str, subject_id) -> str:
    return f"{subject}:{subject_id}"


def has_grant(request: HttpRequest, *subjects: tuple[str, object]) -> bool:
    grants = _grants(request)
    return any(_key(subject, subject_id) in grants for subject, subject_id in subjects)


def render_reason_page(
    request: HttpRequest, *, form: ReasonForm, what: str, owner: User, action: str = ""
) -> TemplateResponse:
    return TemplateResponse(
        request,
        "admin/accounts/staff_read_reason.html",
        {
            **admin.site.each_context(request),
            "title": f"Read {what}",
            "form": form,
            "what": what,
            "owner_name": owner.get_username(),
            "action": action,
            "reason_field": REASON_FIELD,
        },
    )


def gate(
    request: HttpRequest,
    *,
    owner: User,
    subject: str,
    subject_id,
    what: str,
    covered_by: tuple[tuple[str, object], ...] = (),
) -> HttpResponse | None:
    """None when the page may show `owner`'s `subject` now; otherwise what to answer instead:
    the reason's form, or (once a reason was given and recorded) a redirect back to the page.
    Raises PermissionDenied for staff without the permission. `covered_by`: grants that also
    open this object (a conversation's grant opens its messages)."""
    if owner.pk == request.user.pk:
        return None
    require_permission(request)
    if has_grant(request, (subject, subject_id), *covered_by):
        return None
    form = reason_form(request)
    if form.is_bound and form.is_valid():
        services.staff_read_record(
            reader=request.user,
            owners=[(owner, str(subject_id))],
            subject=subject,
            reason=form.cleaned_data[REASON_FIELD],
            address=client_ip(request),
        )
        grants = _grants(request)
        grants[_key(subject, subject_id)] = time.time() + grant_seconds()
        request.session[SESSION_KEY] = grants
        return redirect(request.get_full_path())
    return render_reason_page(request, form=form, what=what, owner=owner)
