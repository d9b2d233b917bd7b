"""The second factor for staff: once SLUICE_STAFF_MFA_REQUIRED is on, the admin (and the
operations pages in it) refuses staff who have not set up TOTP, and says how; with TOTP set up
their sign-in asks for the code before the admin opens."""

from __future__ import annotations

import pytest
from allauth.mfa.models import Authenticator
from allauth.mfa.totp.internal.auth import (
    TOTP,
    generate_totp_secret,
    hotp_value,
    yield_hotp_counters_from_time,
)
from django.test import Client

from apps.accounts.services import user_create

pytestmark = pytest.mark.django_db

PASSWORD = "correct-horse-battery"


@pytest.fixture
def staff(db):
    return user_create(username="root", password=PASSWORD, is_staff=True)


def admin_sign_in(client: Client):
    return client.post(
        "/admin/login/", {"username": "root", "password": PASSWORD, "next": "/admin/"}
    )


def test_without_the_setting_staff_use_the_admin_as_before(staff, settings):
    settings.SLUICE_STAFF_MFA_REQUIRED = False
    client = Client()
    assert admin_sign_in(client)["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200


def test_once_required_staff_without_totp_are_refused_the_admin(staff, settings):
    settings.SLUICE_STAFF_MFA_REQUIRED = True
    client = Client()
    admin_sign_in(client)
    for url in ("/admin/", "/admin/ops/", "/admin/accounts/user/"):
        landing = client.get(url, follow=True)
        assert landing.status_code == 403, url
        assert "Set up a second factor first" in landing.content.decode()
    # The way out is open: the TOTP set-up (behind the password asked again).
    assert client.get("/accounts/2fa/totp/activate/").status_code == 302
    # People who are not staff are not asked.
    person = user_create(username="pat", password=PASSWORD)
    other = Client()
    other.force_login(person)
    assert other.get("/").status_code == 200


def test_once_required_staff_with_totp_give_the_code_then_use_the_admin(staff, settings):
    settings.SLUICE_STAFF_MFA_REQUIRED = True
    secret = generate_totp_secret()
    TOTP.activate(staff, secret)
    client = Client()
    asked = admin_sign_in(client)
    assert asked["Location"].startswith("/accounts/2fa/authenticate/")
    assert client.get("/admin/").status_code == 302  # not signed in until the code is given
    code = f"{hotp_value(secret, next(yield_hotp_counters_from_time())):06d}"
    signed_in = client.post("/accounts/2fa/authenticate/", {"code": code})
    assert signed_in["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200
    assert Authenticator.objects.filter(user=staff).exists()


def test_production_requires_it_by_default(monkeypatch):
    import importlib

    monkeypatch.setenv("SECRET_KEY", "x" * 50)
    monkeypatch.setenv("ALLOWED_HOSTS", "sluice.example.org")
    monkeypatch.delenv("SLUICE_STAFF_MFA_REQUIRED", raising=False)
    production = importlib.import_module("chatsite.settings.production")
    assert importlib.reload(production).SLUICE_STAFF_MFA_REQUIRED is True
