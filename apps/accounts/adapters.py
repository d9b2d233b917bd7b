"""Where Sluice's accounts meet django-allauth's flows: who may sign up, which login stages
apply, and when a sign-in through an identity provider may reach an existing account."""

from __future__ import annotations

from allauth.account.adapter import DefaultAccountAdapter
from allauth.account.models import EmailAddress
from allauth.account.stages import EmailVerificationStage
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter
from django.conf import settings
from django.contrib.auth.hashers import make_password

from apps.accounts.forms import client_ip

VERIFICATION_STAGE = "allauth.account.stages.EmailVerificationStage"


class AccountAdapter(DefaultAccountAdapter):
    def is_open_for_signup(self, request) -> bool:
        """Local sign-up closes with the local password (SLUICE_LOCAL_PASSWORD)."""
        return settings.SLUICE_LOCAL_PASSWORD

    def get_login_stages(self) -> list[str]:
        return [
            "apps.accounts.adapters.SluiceEmailVerificationStage"
            if path == VERIFICATION_STAGE
            else path
            for path in super().get_login_stages()
        ]

    def get_client_ip(self, request) -> str:
        # The address the rest of Sluice throttles and records by (a proxy in front sets
        # REMOTE_ADDR through the ASGI server, see docs/deploy.md).
        return client_ip(request) or "0.0.0.0"


class SluiceEmailVerificationStage(EmailVerificationStage):
    """allauth's stage, except for accounts with no address at all: staff made those (the
    admin, `createsuperuser`, `seed_demo`) or they predate the setting, and a sign-in that
    asks them to verify an address they do not have could never finish. Anyone who signed up
    while an address was required has one, verified or waiting for its link."""

    def handle(self):
        user = self.login.user
        if user is not None and not self.login.signup and not user.email:
            if not EmailAddress.objects.filter(user=user).exists():
                return None, True
        return super().handle()


class SocialAccountAdapter(DefaultSocialAccountAdapter):
    def is_open_for_signup(self, request, sociallogin) -> bool:
        """A person the identity provider vouches for gets an account, even while local
        sign-up is closed: that is what turning the local password off is for."""
        return True

    def authenticate_by_email(self, sociallogin):
        """The existing account this sign-in belongs to, only where an address the provider
        verified is also verified here. allauth alone would also take an account whose address
        was never verified (wiping its password): someone who signed up with another person's
        address must not be handed that person's sign-in."""
        for address in sociallogin.email_addresses:
            if not address.verified:
                continue
            if not self.can_authenticate_by_email(sociallogin, address.email):
                continue
            local = (
                EmailAddress.objects.filter(email__iexact=address.email, verified=True)
                .select_related("user")
                .first()
            )
            if local is not None:  # a suspended one is told so by allauth's inactive page
                return local.user, address.email
        return None


def password_work(password: str) -> None:
    """Hashes `password` and throws the hash away: a form that refuses without creating an
    account spends the time creating one would, so the time taken tells nothing."""
    make_password(password or "")
