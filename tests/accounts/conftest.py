from __future__ import annotations

import pytest

from tests.accounts.smtp import SmtpServer


@pytest.fixture
def smtp():
    """A real SMTP server on loopback; Django in this process sends its mail there."""
    with SmtpServer() as server:
        yield server


@pytest.fixture
def smtp_mail(smtp, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp.port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    return smtp.inbox


@pytest.fixture
def verification_required(settings):
    """Sign-up as SLUICE_EMAIL_VERIFICATION=required (production's default) sets it up."""
    settings.ACCOUNT_EMAIL_VERIFICATION = "mandatory"
    settings.ACCOUNT_SIGNUP_FIELDS = ["username*", "email*", "password1*", "password2*"]
