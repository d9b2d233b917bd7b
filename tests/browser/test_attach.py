"""Chat with your own file, in headless Chromium on a phone-sized screen: attach a Markdown file
in the composer, watch it being read, ask about it, and find it cited under the answer (the real
web process ingests it, a real worker answers with SmolLM2, the dispatcher stores the answer)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from apps.accounts.services import user_create
from apps.chat.services import conversation_create

pytestmark = pytest.mark.browser

# A source shows under an answer that uses it: cites it as [1], or (what the small model does)
# repeats enough of its words. So the file says what any answer about sluice gates says, and
# one thing only it knows, which its source page shows.
NOTES = b"""# Canal notes

A sluice gate controls the flow of water in a canal. Raising the gate releases water from the
upper channel into the lower channel, to control water levels along the canal. The Gorbulon
sluice on the Marrow canal was built in 1791 and still works today.
"""
QUESTION = "What is a sluice gate?"


@pytest.fixture
def answers_long_enough(short_answers, settings):
    settings.MODEL_MAX_TOKENS = 40


def _log_in(page, base_url: str, username: str) -> None:
    page.goto(base_url + "/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "a-long-passphrase-9")
    page.click("button[type=submit]")


def test_a_file_attached_in_the_composer_is_read_and_cited(
    answers_long_enough, live_web, start_worker, dispatcher, browser_page
):
    start_worker("browser-worker")
    user = user_create(username="keeper", password="a-long-passphrase-9")
    conversation = conversation_create(owner=user)
    page = browser_page
    _log_in(page, live_web, "keeper")
    page.goto(f"{live_web}/c/{conversation.id}/")

    page.fill("textarea[name=text]", "draft that must survive")
    # A file of the wrong type: a clear error, and the draft is still there.
    page.set_input_files(
        "#attach-input",
        files=[
            {
                "name": "slides.pptx",
                "mimeType": "application/octet-stream",
                "buffer": b"PK\x03\x04",
            },
        ],
    )
    rejected = page.locator(".attachment[data-status=failed]")
    expect(rejected).to_contain_text("PDF, Markdown, HTML or text")
    expect(page.locator("textarea[name=text]")).to_have_value("draft that must survive")
    rejected.locator(".attachment-dismiss").click()

    page.set_input_files(
        "#attach-input",
        files=[
            {"name": "canal.md", "mimeType": "text/markdown", "buffer": NOTES},
        ],
    )
    chip = page.locator(".attachment", has_text="canal.md")
    expect(chip).to_have_attribute("data-status", "ready", timeout=60_000)
    expect(chip).to_contain_text("Ready")

    page.fill("textarea[name=text]", QUESTION)
    page.click("#composer button[type=submit]:has-text('Send')")
    answer = page.locator(".message.assistant").last
    expect(answer.locator(".text")).not_to_be_empty(timeout=120_000)
    expect(page.locator(".message.assistant.pending")).to_have_count(0, timeout=120_000)
    expect(page.locator("#regenerate-button")).to_be_visible(timeout=120_000)
    source = answer.locator(".citations a", has_text="Canal notes")
    expect(source).to_have_count(1, timeout=10_000)
    assert page.evaluate("document.documentElement.scrollWidth") <= 375

    # The citation opens the file's own text.
    source.click()
    expect(page.locator("main article")).to_contain_text("The Gorbulon sluice on the Marrow canal")

    # The profile page lists it; deleting it there removes it.
    page.goto(live_web + "/accounts/profile/")
    entry = page.locator("#your-files .user-file", has_text="canal.md")
    expect(entry).to_contain_text("Ready")
    page.once("dialog", lambda dialog: dialog.accept())
    entry.locator("button", has_text="Delete").click()
    expect(page.locator("#your-files")).to_contain_text("No files yet.")
