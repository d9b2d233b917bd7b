"""Accounts in Chromium against a real daphne, the real database and Redis: signing up and
verifying the address from a mail a real SMTP server (aiosmtpd, on loopback) received; a
password reset from the mail that ends the old sessions; signing in through a real OpenID
Connect provider (a second process); and a second factor, used with a code and with a
recovery code."""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct
import subprocess
import time

import pytest
from allauth.account.models import EmailAddress
from playwright.sync_api import expect

from apps.accounts.models import User
from apps.accounts.services import user_create
from devstack.stack import free_port, web_command
from tests.accounts.oidc import callback_path, oidc_provider, provider_environment
from tests.accounts.smtp import SmtpServer, link_in
from tests.browser.test_tools import serious_violations
from tests.conftest import BASE_DIR, process_env, stop_process, wait_for_http

pytestmark = pytest.mark.browser

PASSPHRASE = "a-long-passphrase-9"


@pytest.fixture
def web(transactional_db, redis_prefix):
    """start(port=None, **environment) -> base URL of a daphne serving Sluice."""
    started = []

    def start(port: int | None = None, **changes: str) -> str:
        port = port or free_port()
        env = {**process_env(redis_prefix), **changes}
        process = subprocess.Popen(web_command("127.0.0.1", port), cwd=BASE_DIR, env=env)
        started.append(process)
        base = f"http://127.0.0.1:{port}"
        wait_for_http(base + "/health/", process)
        return base

    yield start
    for process in started:
        stop_process(process)


@pytest.fixture
def smtp():
    with SmtpServer() as server:
        yield server


def sign_in(page, base: str, login: str, password: str = PASSPHRASE) -> None:
    page.goto(base + "/accounts/login/")
    page.get_by_label("Username or email").fill(login)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()


def test_sign_up_verify_the_address_from_the_mail_and_sign_in(web, smtp, browser_page):
    base = web(SLUICE_EMAIL_VERIFICATION="required", EMAIL_URL=smtp.url)
    page = browser_page
    page.goto(base + "/accounts/signup/")
    page.get_by_label("Username").fill("wanda")
    page.get_by_label("Email").fill("wanda@example.org")
    page.get_by_label("Password", exact=True).fill(PASSPHRASE)
    page.get_by_label("Password (again)").fill(PASSPHRASE)
    page.get_by_role("button", name="Sign up").click()
    expect(page.locator("main")).to_contain_text("Verify Your Email Address")
    assert serious_violations(page) == []

    # Not yet verified: signing in sends the person back to the mail.
    sign_in(page, base, "wanda")
    expect(page.locator("main")).to_contain_text("Verify Your Email Address")
    assert not EmailAddress.objects.get(email="wanda@example.org").verified

    mail = smtp.inbox.wait_for("wanda@example.org", subject="Please Confirm")
    page.goto(link_in(mail, "/accounts/confirm-email/"))
    page.get_by_role("button", name="Confirm").click()
    assert EmailAddress.objects.get(email="wanda@example.org").verified

    sign_in(page, base, "wanda@example.org")  # by address, now that it is hers
    expect(page.locator("#new-chat-form")).to_be_visible()
    expect(page.get_by_role("button", name="Log out")).to_be_visible()


def test_a_password_reset_from_the_mail_ends_the_old_sessions(web, smtp, browser_page):
    user = user_create(username="rosa", password="old-passphrase-1", email="rosa@example.org")
    EmailAddress.objects.create(user=user, email=user.email, verified=True, primary=True)
    base = web(EMAIL_URL=smtp.url)
    page = browser_page
    elsewhere = page.context.browser.new_context().new_page()  # another device, signed in
    sign_in(elsewhere, base, "rosa", "old-passphrase-1")
    elsewhere.goto(base + "/accounts/profile/")
    expect(elsewhere.locator("h1")).to_have_text("Your profile")

    page.goto(base + "/accounts/login/")
    page.get_by_role("link", name="Forgot your password?").click()
    page.get_by_label("Email").fill("rosa@example.org")
    page.get_by_role("button", name="Reset My Password").click()
    expect(page.locator("main")).to_contain_text("sent you an email")
    mail = smtp.inbox.wait_for("rosa@example.org", subject="Password Reset")
    page.goto(link_in(mail, "/accounts/password/reset/key/"))
    page.locator("#id_password1").fill(PASSPHRASE)
    page.locator("#id_password2").fill(PASSPHRASE)
    page.get_by_role("button", name="Change Password").click()
    expect(page.locator("main")).to_contain_text("Your password is now changed")

    elsewhere.goto(base + "/accounts/profile/")  # the old session is over
    assert "/accounts/login/" in elsewhere.url
    elsewhere.context.close()
    sign_in(page, base, "rosa", "old-passphrase-1")
    expect(page.locator("main")).to_contain_text("Please enter a correct username")
    sign_in(page, base, "rosa")
    expect(page.locator("#new-chat-form")).to_be_visible()


def test_sign_in_through_the_identity_provider(web, browser_page, tmp_path):
    port = free_port()
    redirect_uri = f"http://127.0.0.1:{port}" + callback_path()
    person = {"username": "tomas", "password": "idp-passphrase-2", "email": "tomas@example.org"}
    with oidc_provider(tmp_path / "idp", redirect_uri=redirect_uri, users=[person]) as issuer:
        base = web(port, **provider_environment(issuer))
        page = browser_page
        page.goto(base + "/accounts/login/")
        page.get_by_role("link", name="Test IdP").click()
        page.get_by_role("button", name="Continue").click()
        expect(page.locator("h1")).to_have_text("Test identity provider")
        page.get_by_label("Username").fill("tomas")
        page.get_by_label("Password").fill("idp-passphrase-2")
        page.get_by_role("button", name="Sign in to the provider").click()
        expect(page.locator("#new-chat-form")).to_be_visible()
        expect(page.get_by_role("button", name="Log out")).to_be_visible()
    user = User.objects.get(email="tomas@example.org")
    assert EmailAddress.objects.get(user=user).verified


def totp(secret: str, *, at: float | None = None) -> str:
    """RFC 6238's code (SHA-1, 30 s, 6 digits), as an authenticator app computes it."""
    key = base64.b32decode(secret.upper() + "=" * (-len(secret) % 8))
    counter = int((time.time() if at is None else at) // 30)
    digest = hmac.new(key, struct.pack(">Q", counter), hashlib.sha1).digest()
    offset = digest[-1] & 0x0F
    value = struct.unpack(">I", digest[offset : offset + 4])[0] & 0x7FFFFFFF
    return f"{value % 1_000_000:06d}"


def next_period() -> None:
    """Waits for the next 30-second period: a code is good once."""
    time.sleep(30 - time.time() % 30 + 0.5)


def test_set_up_totp_then_sign_in_with_a_code_and_with_a_recovery_code(web, browser_page):
    user_create(username="uma", password=PASSPHRASE)
    base = web()
    page = browser_page
    sign_in(page, base, "uma")
    page.goto(base + "/accounts/profile/")
    page.get_by_role("link", name="Two-factor authentication").click()
    page.goto(base + "/accounts/2fa/totp/activate/")
    # Adding a factor asks for the password again, however recent the sign-in.
    page.get_by_label("Password").fill(PASSPHRASE)
    page.get_by_role("button", name="Confirm").click()
    secret = page.locator("#authenticator_secret").input_value()
    page.get_by_label("Authenticator code").fill(totp(secret))
    page.get_by_role("button", name="Activate").click()
    page.goto(base + "/accounts/2fa/recovery-codes/")
    codes = page.locator("#recovery_codes").input_value().split()
    assert len(codes) == 10
    page.get_by_role("button", name="Log out").click()

    next_period()
    sign_in(page, base, "uma")
    page.get_by_label("Code").fill("000000" if totp(secret) != "000000" else "111111")
    page.get_by_role("button", name="Sign In").click()
    expect(page.locator("main")).to_contain_text("Incorrect code")
    page.get_by_label("Code").fill(totp(secret))
    page.get_by_role("button", name="Sign In").click()
    expect(page.locator("#new-chat-form")).to_be_visible()
    page.get_by_role("button", name="Log out").click()

    sign_in(page, base, "uma")
    page.get_by_label("Code").fill(codes[0])  # the phone is lost
    page.get_by_role("button", name="Sign In").click()
    expect(page.locator("#new-chat-form")).to_be_visible()
    page.get_by_role("button", name="Log out").click()
    sign_in(page, base, "uma")
    page.get_by_label("Code").fill(codes[0])  # a recovery code is good once
    page.get_by_role("button", name="Sign In").click()
    expect(page.locator("main")).to_contain_text("Incorrect code")
