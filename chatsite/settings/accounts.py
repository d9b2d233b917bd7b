"""Accounts: sign-up with a verified email, password reset, OpenID Connect sign-in, TOTP with
recovery codes and the rate limits on every account form, through django-allauth. Each setting
is described in docs/accounts.md."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from chatsite.settings.environment import env

# Whether a new account needs a verified email address: "required" (sign-in waits for the
# link in the mail), "optional" (the mail is sent, sign-in goes on), "off" (no address asked).
SLUICE_EMAIL_VERIFICATION = env.str("SLUICE_EMAIL_VERIFICATION", default="required")


def email_verification(mode: str) -> dict:
    """allauth's settings for a SLUICE_EMAIL_VERIFICATION mode."""
    methods = {"required": "mandatory", "optional": "optional", "off": "none"}
    if mode not in methods:
        raise ImproperlyConfigured("SLUICE_EMAIL_VERIFICATION: required, optional or off.")
    return {
        "ACCOUNT_EMAIL_VERIFICATION": methods[mode],
        "ACCOUNT_SIGNUP_FIELDS": [
            "username*",
            "email" if mode == "off" else "email*",
            "password1*",
            "password2*",
        ],
    }


vars().update(email_verification(SLUICE_EMAIL_VERIFICATION))
ACCOUNT_LOGIN_METHODS = {"username", "email"}
ACCOUNT_UNIQUE_EMAIL = True
# No form says whether an address has an account: sign-up and reset answer alike and send a
# mail either way ("you have no account here" to an unknown address).
ACCOUNT_PREVENT_ENUMERATION = True
ACCOUNT_EMAIL_UNKNOWN_ACCOUNTS = True
# One address per account; a new one replaces it only once its link is followed.
ACCOUNT_CHANGE_EMAIL = True
# Sessions last as long as Django's own login made them last (no "remember me" box).
ACCOUNT_SESSION_REMEMBER = True
ACCOUNT_LOGOUT_ON_GET = False
ACCOUNT_ADAPTER = "apps.accounts.adapters.AccountAdapter"
SOCIALACCOUNT_ADAPTER = "apps.accounts.adapters.SocialAccountAdapter"
ACCOUNT_FORMS = {
    "login": "apps.accounts.signin.SluiceLoginForm",
    "signup": "apps.accounts.signin.SluiceSignupForm",
}
ACCOUNT_EMAIL_SUBJECT_PREFIX = env.str("ACCOUNT_EMAIL_SUBJECT_PREFIX", default="[Sluice] ")
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="Sluice <sluice@localhost>")

# Posts one client address may make to each account form (sign-up, sign-in, password reset,
# the reset link's form) in allauth's notation; past it the form answers 429. Per address and
# account as well: a password reset mail at most every ACCOUNT_RESET_PER_ADDRESS_RATE, and
# LOGIN_THROTTLE_ATTEMPTS failed sign-ins per account and address (base.py).
ACCOUNT_FORM_RATE = env.str("ACCOUNT_FORM_RATE", default="20/m/ip")
ACCOUNT_RESET_PER_ADDRESS_RATE = env.str("ACCOUNT_RESET_PER_ADDRESS_RATE", default="5/m/key")
ACCOUNT_RATE_LIMITS = {
    "signup": ACCOUNT_FORM_RATE,
    "login": ACCOUNT_FORM_RATE,
    # Per account as well, for TOTP and recovery codes above all (a password's failures meet
    # LOGIN_THROTTLE_ATTEMPTS first).
    "login_failed": f"{ACCOUNT_FORM_RATE},10/5m/key",
    "reset_password": f"{ACCOUNT_FORM_RATE},{ACCOUNT_RESET_PER_ADDRESS_RATE}",
    "reset_password_from_key": ACCOUNT_FORM_RATE,
    "change_password": "5/m/user",
    "manage_email": "10/m/user",
    "reauthenticate": "10/m/user",
}

# Mail: EMAIL_URL (smtp://user:password@host:587/?tls=True, django-environ's form) sends it;
# unset, every mail is printed on the console and kept on the dev mailbox page
# (/accounts/dev/mailbox/, for staff, or anyone while DEBUG is on), so `make run` needs no
# mail server.
EMAIL_URL = env.str("EMAIL_URL", default="")
if EMAIL_URL:
    vars().update(env.email_url_config(EMAIL_URL))
else:
    EMAIL_BACKEND = "apps.accounts.mailbox.DevMailboxBackend"
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=10)
DEV_MAILBOX_KEEP = env.int("DEV_MAILBOX_KEEP", default=200)

# Signing in with a password at all; False leaves only the identity provider (no local sign-up,
# password sign-in, reset or change).
SLUICE_LOCAL_PASSWORD = env.bool("SLUICE_LOCAL_PASSWORD", default=True)

# An OpenID Connect provider from the environment (another can be added in the admin, as a
# "Social application" of provider "OpenID Connect" with its issuer as `server_url`).
OIDC_ISSUER_URL = env.str("OIDC_ISSUER_URL", default="")
OIDC_PROVIDER_ID = env.str("OIDC_PROVIDER_ID", default="oidc")
_OIDC_APPS = []
if OIDC_ISSUER_URL:
    _OIDC_APPS.append(
        {
            "provider_id": OIDC_PROVIDER_ID,
            "name": env.str("OIDC_NAME", default="Single sign-on"),
            "client_id": env.str("OIDC_CLIENT_ID"),
            "secret": env.str("OIDC_CLIENT_SECRET"),
            "settings": {"server_url": OIDC_ISSUER_URL},
        }
    )
SOCIALACCOUNT_PROVIDERS = {"openid_connect": {"OAUTH_PKCE_ENABLED": True, "APPS": _OIDC_APPS}}
# A provider's sign-in reaches an existing account only through an address both the provider
# and Sluice have verified (apps/accounts/adapters.py); it is then connected to that account.
SOCIALACCOUNT_EMAIL_AUTHENTICATION = True
SOCIALACCOUNT_EMAIL_AUTHENTICATION_AUTO_CONNECT = True
SOCIALACCOUNT_AUTO_SIGNUP = True
SOCIALACCOUNT_LOGIN_ON_GET = False  # the provider's button posts: no sign-in by a mere link
SOCIALACCOUNT_STORE_TOKENS = False

# A second factor: TOTP, with recovery codes for when the phone is lost.
MFA_SUPPORTED_TYPES = ["totp", "recovery_codes"]
MFA_TOTP_ISSUER = env.str("MFA_TOTP_ISSUER", default="Sluice")
# Staff must have set one up before the admin lets them in (on by default in production.py).
SLUICE_STAFF_MFA_REQUIRED = env.bool("SLUICE_STAFF_MFA_REQUIRED", default=False)
