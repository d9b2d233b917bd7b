from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from . import services
from .forms import ProfileForm, SignupForm


def client_ip(request: HttpRequest) -> str:
    return request.META.get("REMOTE_ADDR", "")


class ThrottledLoginView(auth_views.LoginView):
    """Django's login, refusing an account + address pair after repeated failures.

    The same message answers for existing and unknown accounts, so it reveals nothing.
    """

    template_name = "accounts/login.html"
    redirect_authenticated_user = True

    def post(self, request, *args, **kwargs):
        username = request.POST.get("username", "")[:150]
        ip = client_ip(request)
        wait = services.login_throttle_seconds_left(username=username, client_ip=ip)
        if wait:
            form = self.get_form()
            form.errors.clear()
            form.add_error(
                None, f"Too many failed attempts. Please wait {wait} seconds and try again."
            )
            return self.render_to_response(self.get_context_data(form=form), status=429)
        response = super().post(request, *args, **kwargs)
        if request.user.is_authenticated:
            services.login_failures_clear(username=username, client_ip=ip)
        else:
            services.login_failure_record(username=username, client_ip=ip)
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
    return render(request, "accounts/profile.html", {
        "form": form, "api_keys": request.user.api_keys.filter(revoked=False),
    })  # fmt: skip


@login_required
@require_POST
def api_key_new(request: HttpRequest) -> HttpResponse:
    key, raw = services.api_key_create(user=request.user, name=request.POST.get("name", ""))
    # Shown once on the next page; only its hash is stored.
    messages.success(request, f"New API key “{key.name}”: {raw} — copy it now, it will not be "
                     "shown again.")  # fmt: skip
    return redirect("accounts:profile")


@login_required
@require_POST
def api_key_revoke(request: HttpRequest, key_id: int) -> HttpResponse:
    services.api_key_revoke(user=request.user, key_id=key_id)
    messages.success(request, "API key revoked.")
    return redirect("accounts:profile")
