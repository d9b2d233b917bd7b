"""Sign-in and sign-up through django-allauth's flows (email verification, TOTP, identity
providers), with what Sluice adds: the failed-login throttle shared with the admin, the reason
a suspended person is given, one message for every wrong answer, and the admin's login."""

from __future__ import annotations

from allauth.account import views as allauth_views
from allauth.account.forms import LoginForm, SignupForm
from django.conf import settings
from django.contrib import admin
from django.contrib.auth import logout as auth_logout
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.timezone import localtime

from apps.accounts import services
from apps.accounts.adapters import password_work
from apps.accounts.admin_site import second_factor_missing
from apps.accounts.forms import client_ip

INVALID_LOGIN = (
    "Please enter a correct username and password (or email address and password). "
    "Both may be case-sensitive."
)
# allauth's codes for a wrong password, told apart by what was typed (an email or a name):
# answered with the one message above, so no answer differs by anything but the input.
MISMATCH = {"username_password_mismatch", "email_password_mismatch", "invalid_login"}
ALLAUTH_FAILED_WINDOW = 300  # the per-account window of ACCOUNT_RATE_LIMITS["login_failed"]


class SluiceLoginForm(LoginForm):
    """allauth's sign-in form under the field names Sluice's login always had (`username`,
    `password`: scripts, password managers and the admin post them), refusing an account +
    address pair after repeated failures before the password is checked (a throttled guess
    costs no hashing and learns nothing). Throttled forms carry `throttled_seconds`."""

    throttled_seconds = 0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["login"].label = "Username or email"

    def add_prefix(self, field_name: str) -> str:
        return super().add_prefix("username" if field_name == "login" else field_name)

    def clean(self):
        login = str(self.data.get("username", "")).strip()[:254]
        ip = client_ip(self.request)
        wait = services.login_throttle_seconds_left(username=login, client_ip=ip)
        if wait:
            self.throttled_seconds = wait
            raise ValidationError(
                f"Too many failed attempts. Please wait {wait} seconds and try again.",
                code="throttled",
            )
        self._refuse_if_suspended(login, ip)
        try:
            cleaned = super().clean()
        except ValidationError as exc:
            if exc.code in MISMATCH:
                services.login_failure_record(username=login, client_ip=ip)
                raise ValidationError(INVALID_LOGIN, code="invalid_login") from None
            if exc.code == "too_many_login_attempts":  # allauth's own count: a 429 as well
                self.throttled_seconds = ALLAUTH_FAILED_WINDOW
            raise
        if self.user is not None:
            services.login_failures_clear(username=login, client_ip=ip)
        return cleaned

    def _refuse_if_suspended(self, login: str, ip: str) -> None:
        """A suspended person who gives their password is told why and until when. A wrong
        password hears the usual answer, after one password check as for anyone: neither
        the message nor the time tells that the account exists or is suspended."""
        suspension = services.suspension_standing_for_login(username=login)
        if suspension is None:
            return
        if not suspension.user.check_password(str(self.data.get("password", ""))):
            services.login_failure_record(username=login, client_ip=ip)
            raise ValidationError(INVALID_LOGIN, code="invalid_login")
        until = (
            f"until {localtime(suspension.until):%Y-%m-%d %H:%M %Z}"
            if suspension.until
            else "until a member of staff lifts it"
        )
        raise ValidationError(
            "Your account is suspended %(until)s. The reason given: %(reason)s",
            code="suspended",
            params={"until": until, "reason": suspension.reason},
        )


class SluiceSignupForm(SignupForm):
    def try_save(self, request):
        """An address that has an account gets a mail saying so and the page every sign-up
        gets; the password is hashed all the same, so the answer takes as long as creating
        the account would."""
        if self.account_already_exists:
            password_work(self.cleaned_data.get("password1", ""))
        return super().try_save(request)


def throttled_status(response: HttpResponse) -> HttpResponse:
    """A sign-in page whose form was refused by the throttle answers 429 with Retry-After."""
    form = (getattr(response, "context_data", None) or {}).get("form")
    wait = getattr(form, "throttled_seconds", 0)
    if wait:
        response.status_code = 429
        response["Retry-After"] = str(wait)
    return response


class LoginView(allauth_views.LoginView):
    """allauth's sign-in (its stages: email verification, the second factor), with the
    throttle's 429, and no password at all while the local password is off."""

    default_next = ""

    def post(self, request, *args, **kwargs):
        if not settings.SLUICE_LOCAL_PASSWORD:
            raise PermissionDenied("Sign in through the identity provider.")
        return throttled_status(super().post(request, *args, **kwargs))

    def get_next_url(self):
        return super().get_next_url() or self.default_next or None

    def get_context_data(self, **kwargs) -> dict:
        context = super().get_context_data(**kwargs)
        context["local_password"] = settings.SLUICE_LOCAL_PASSWORD
        return context


login = LoginView.as_view()


def admin_login(request: HttpRequest, extra_context=None) -> HttpResponse:
    """The admin's login is the site's (the same throttle, the second factor, the identity
    provider), landing on the admin. Signed-in staff who have not set up a second factor
    while one is required are refused with a way to set it up. Someone signed in who is not
    staff is refused the page; posting the form signs them in as the account it names instead,
    as Django's own admin login does (so its failures count like anyone's)."""
    if request.user.is_authenticated and not (request.user.is_active and request.user.is_staff):
        if request.method != "POST":
            raise PermissionDenied
        auth_logout(request)
    if request.user.is_authenticated:
        if second_factor_missing(request.user):
            return render(request, "accounts/second_factor_required.html", status=403)
        return admin.site.login(request, extra_context)
    return LoginView.as_view(default_next=reverse("admin:index"))(request)


def local_password_only(view):
    """Views of the local password (reset, change, set) are not there while it is off."""

    def wrapped(request, *args, **kwargs):
        if not settings.SLUICE_LOCAL_PASSWORD:
            raise Http404
        return view(request, *args, **kwargs)

    return wrapped
