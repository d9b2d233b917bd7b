from __future__ import annotations

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm, UserCreationForm
from django.core.exceptions import ValidationError
from django.utils.timezone import localtime

from apps.accounts import services
from apps.accounts.models import Profile, Tag, User


class SignupForm(UserCreationForm):
    email = forms.EmailField(required=False, help_text="Optional; used only for password resets.")

    class Meta(UserCreationForm.Meta):
        model = User
        fields = ("username", "email")


class ProfileForm(forms.ModelForm):
    tags = forms.ModelMultipleChoiceField(
        queryset=Tag.objects.filter(is_active=True),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="These shape how the assistant answers you.",
    )

    class Meta:
        model = Profile
        fields = ("display_name", "language", "expertise", "about", "tags")
        widgets = {"about": forms.Textarea(attrs={"rows": 4, "maxlength": 500})}


def client_ip(request) -> str:
    return request.META.get("REMOTE_ADDR", "") if request is not None else ""


class LoginThrottleMixin:
    """For AuthenticationForm and its subclasses: refuses an account + address pair after
    repeated failed logins, before the password is even checked (so a throttled guess costs no
    hashing and learns nothing). The same message answers for existing and unknown accounts.
    Throttled forms carry `throttled_seconds`, for the view's 429."""

    throttled_seconds = 0

    def clean(self):
        username = str(self.data.get("username", ""))[:150]
        ip = client_ip(self.request)
        wait = services.login_throttle_seconds_left(username=username, client_ip=ip)
        if wait:
            self.throttled_seconds = wait
            raise ValidationError(
                f"Too many failed attempts. Please wait {wait} seconds and try again.",
                code="throttled",
            )
        self._refuse_if_suspended(username, ip)
        try:
            cleaned = super().clean()
        except ValidationError as exc:
            if getattr(exc, "code", None) == "invalid_login":
                services.login_failure_record(username=username, client_ip=ip)
            raise
        if self.get_user() is not None:
            services.login_failures_clear(username=username, client_ip=ip)
        return cleaned

    def _refuse_if_suspended(self, username: str, ip: str) -> None:
        """A suspended person who gives their password is told why and until when. A wrong
        password hears the usual answer, after one password check as for anyone: neither
        the message nor the time tells that the account exists or is suspended."""
        suspension = services.suspension_standing_for_login(username=username)
        if suspension is None:
            return
        if not suspension.user.check_password(str(self.data.get("password", ""))):
            services.login_failure_record(username=username, client_ip=ip)
            raise ValidationError(
                self.error_messages["invalid_login"],
                code="invalid_login",
                params={"username": self.username_field.verbose_name},
            )
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


class ThrottledAuthenticationForm(LoginThrottleMixin, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(LoginThrottleMixin, AdminAuthenticationForm):
    pass
