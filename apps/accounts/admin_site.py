"""The admin site, refusing staff who have no second factor while SLUICE_STAFF_MFA_REQUIRED
is on (their sign-in then lands on a page that says so and links to the TOTP set-up)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.apps import AdminConfig


def second_factor_missing(user) -> bool:
    """Whether `user` is staff without the second factor the settings require of staff."""
    if not (settings.SLUICE_STAFF_MFA_REQUIRED and user.is_authenticated and user.is_staff):
        return False
    from allauth.mfa.models import Authenticator  # models load after the admin's app config

    return not Authenticator.objects.filter(user=user, type=Authenticator.Type.TOTP).exists()


class SluiceAdminSite(admin.AdminSite):
    def has_permission(self, request) -> bool:
        return super().has_permission(request) and not second_factor_missing(request.user)


class SluiceAdminConfig(AdminConfig):
    default_site = "apps.accounts.admin_site.SluiceAdminSite"
