"""One user journey in headless Chromium, on a phone-sized screen, against a real daphne, a real
worker running SmolLM2 and the dispatcher that stores answers."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser


def test_sign_up_log_in_chat_and_find_it_after_reload(
    short_answers, live_web, start_worker, dispatcher, browser_page
):
    start_worker("browser-worker")
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

    # No chat yet: the message box of a new chat is ready; the chat is stored with the question.
    page.fill("textarea[name=text]", "What is a sluice gate?")
    page.click("#send-button")
    expect(page.locator(".message.user").first).to_contain_text("What is a sluice gate?")

    # The answer streams in, then is rendered as sanitised Markdown in place.
    answer = page.locator(".message.assistant").first
    expect(answer.locator(".text")).not_to_be_empty(timeout=120_000)
    expect(page.locator(".message.assistant.pending")).to_have_count(0, timeout=120_000)
    expect(page.locator("#regenerate-button")).to_be_visible()
    answer_text = answer.locator(".text").inner_text()

    page.reload()
    expect(page.locator(".message.user").first).to_contain_text("What is a sluice gate?")
    expect(page.locator(".message.assistant .text").first).to_have_text(answer_text)
    # Nothing spills sideways on a 375 px screen.
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
