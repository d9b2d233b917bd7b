"""One user journey in headless Chromium, on a phone-sized screen, against a real daphne."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser


def test_sign_up_log_in_chat_and_find_it_after_reload(live_web, browser_page):
    page = browser_page
    page.goto(live_web + "/accounts/signup/")
    page.fill("#id_username", "walker")
    page.fill("#id_password1", "a-long-passphrase-9")
    page.fill("#id_password2", "a-long-passphrase-9")
    page.click("button[type=submit]")

    page.click("form[action='/accounts/logout/'] button")
    page.goto(live_web + "/accounts/login/")
    page.fill("#id_username", "walker")
    page.fill("#id_password", "a-long-passphrase-9")
    page.click("button[type=submit]")

    page.locator("button:has-text('+ New chat'):visible").first.click()
    page.fill("textarea[name=text]", "What is a sluice gate?")
    page.click("#composer button[type=submit]")
    expect(page.locator(".message.user").first).to_contain_text("What is a sluice gate?")

    page.reload()
    expect(page.locator(".message.user").first).to_contain_text("What is a sluice gate?")
    # Nothing spills sideways on a 375 px screen.
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
