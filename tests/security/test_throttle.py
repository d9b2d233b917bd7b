"""Item 14: the admin's login is throttled like the site's (same helpers, same limits)."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.accounts.services import user_create

pytestmark = pytest.mark.django_db

PASSWORD = "correct-horse-battery"


@pytest.fixture
def staff(db):
    return user_create(username="root", password=PASSWORD, is_staff=True)


def admin_login(client: Client, username: str, password: str):
    return client.post(
        "/admin/login/", {"username": username, "password": password, "next": "/admin/"}
    )


@pytest.mark.parametrize("username", ["root", "nobody-by-this-name"])
def test_repeated_failed_admin_logins_are_throttled(staff, username, settings):
    client = Client()
    for _ in range(settings.LOGIN_THROTTLE_ATTEMPTS):
        assert admin_login(client, username, "wrong-pass").status_code == 200
    throttled = admin_login(client, username, "wrong-pass")
    assert throttled.status_code == 429
    assert int(throttled["Retry-After"]) > 0
    assert b"Too many failed attempts" in throttled.content
    # Even the right password waits out the window.
    assert admin_login(client, "root", PASSWORD).status_code == (429 if username == "root" else 302)


def test_both_logins_count_failures_together(staff, settings):
    client = Client()
    for _ in range(settings.LOGIN_THROTTLE_ATTEMPTS):
        client.post("/accounts/login/", {"username": "root", "password": "wrong-pass"})
    assert admin_login(client, "root", PASSWORD).status_code == 429


def test_a_successful_admin_login_clears_the_count(staff, settings):
    client = Client()
    for _ in range(settings.LOGIN_THROTTLE_ATTEMPTS - 1):
        admin_login(client, "root", "wrong-pass")
    assert admin_login(client, "root", PASSWORD).status_code == 302
    client.logout()
    for _ in range(settings.LOGIN_THROTTLE_ATTEMPTS):
        assert admin_login(client, "root", "wrong-pass").status_code == 200
    assert admin_login(client, "root", "wrong-pass").status_code == 429


def test_a_logged_in_user_cannot_reset_someone_elses_count(staff, user, settings):
    """Failures against another account count even when the form is posted by a logged-in
    (non-staff) user, whose own session is authenticated."""
    client = Client()
    client.force_login(user)
    for _ in range(settings.LOGIN_THROTTLE_ATTEMPTS):
        admin_login(client, "root", "wrong-pass")
    assert admin_login(client, "root", "wrong-pass").status_code == 429
