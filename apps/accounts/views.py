from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from apps.accounts import selectors, services
from apps.accounts.forms import ProfileForm


@login_required
@require_http_methods(["GET", "POST"])
def profile(request: HttpRequest) -> HttpResponse:
    instance = services.profile_get_or_create(user=request.user)
    form = ProfileForm(request.POST or None, instance=instance)
    if request.method == "POST" and form.is_valid():
        services.profile_update(user=request.user, **form.cleaned_data)
        messages.success(request, "Profile saved.")
        return redirect("accounts:profile")
    return render(
        request,
        "accounts/profile.html",
        {
            "form": form,
            "api_keys": request.user.api_keys.filter(revoked=False),
            "tag_proposals": selectors.tag_proposals_open_for_user(user=request.user),
            "local_password": settings.SLUICE_LOCAL_PASSWORD,
        },
    )


@login_required
@require_GET
def privacy(request: HttpRequest) -> HttpResponse:
    """What Sluice's staff read of the person's conversations, when, and the reason given."""
    reads = selectors.staff_reads_of_owner(user=request.user)
    return render(request, "accounts/privacy.html", {"staff_reads": reads})


@login_required
@require_POST
def api_key_new(request: HttpRequest) -> HttpResponse:
    key, raw = services.api_key_create(user=request.user, name=request.POST.get("name", ""))
    # Shown once on the next page; only its hash is stored.
    messages.success(
        request, f"New API key “{key.name}”: {raw} — copy it now, it will not be shown again."
    )
    return redirect("accounts:profile")


@login_required
@require_POST
def api_key_revoke(request: HttpRequest, key_id: int) -> HttpResponse:
    services.api_key_revoke(user=request.user, key_id=key_id)
    messages.success(request, "API key revoked.")
    return redirect("accounts:profile")


@login_required
@require_POST
def tag_proposal_decide(request: HttpRequest, proposal_id: int) -> HttpResponse:
    """Yes (decision=accept) or no (decision=reject) to a proposed tag."""
    decision = request.POST.get("decision")
    # Someone else's proposal is a 404 whatever was posted: ids never leak through the error.
    get_object_or_404(selectors.tag_proposals_open_for_user(user=request.user), id=proposal_id)
    if decision not in ("accept", "reject"):
        messages.error(request, "Choose Add or No thanks.")
        return redirect("accounts:profile")
    proposal = services.tag_proposal_decide(
        user=request.user, proposal_id=proposal_id, accept=decision == "accept"
    )
    if decision == "accept":
        messages.success(request, f"“{proposal.tag.name}” added to your profile.")
    else:
        messages.success(request, f"“{proposal.tag.name}” will not be suggested again.")
    return redirect("accounts:profile")
