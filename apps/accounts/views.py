from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse_lazy
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from apps.accounts import selectors, services
from apps.accounts.forms import ProfileForm, SignupForm, ThrottledAuthenticationForm


def throttled_status(response: HttpResponse) -> HttpResponse:
    """A login page whose form was refused by the throttle answers 429 with Retry-After."""
    form = (getattr(response, "context_data", None) or {}).get("form")
    wait = getattr(form, "throttled_seconds", 0)
    if wait:
        response.status_code = 429
        response["Retry-After"] = str(wait)
    return response


class ThrottledLoginView(auth_views.LoginView):
    """Django's login, refusing an account + address pair after repeated failures (the form
    does the counting: ThrottledAuthenticationForm)."""

    template_name = "accounts/login.html"
    authentication_form = ThrottledAuthenticationForm
    redirect_authenticated_user = True

    def post(self, request, *args, **kwargs):
        return throttled_status(super().post(request, *args, **kwargs))


def admin_login(request: HttpRequest, extra_context=None) -> HttpResponse:
    """The admin's own login (its form is the throttled one, see apps/accounts/admin.py), with
    the site login's 429."""
    return throttled_status(admin.site.login(request, extra_context))


class PasswordChangeView(auth_views.PasswordChangeView):
    template_name = "accounts/password_change.html"
    success_url = reverse_lazy("accounts:profile")

    def form_valid(self, form):
        response = super().form_valid(form)
        messages.success(
            self.request, "Password changed. Your other sessions have been logged out."
        )
        return response


@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("chat:index")
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = services.user_create(
            username=form.cleaned_data["username"],
            password=form.cleaned_data["password1"],
            email=form.cleaned_data.get("email", ""),
        )
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(request, "Welcome to Sluice! Tell us about yourself on your profile.")
        return redirect("chat:index")
    return render(request, "accounts/signup.html", {"form": form})


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
