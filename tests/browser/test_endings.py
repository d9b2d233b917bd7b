"""What the answer's bubble says before its first word and after its last, in headless Chromium
against a real daphne, dispatcher and SmolLM2 worker: "Reading your question (N tokens)…"
while the model reads, and an answer cut at the length cap says so and offers Continue."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from apps.accounts.services import user_create
from apps.chat.services import conversation_create
from tests.browser.test_tools import PASSWORD, log_in

pytestmark = pytest.mark.browser

# Every text the bubbles' status lines show, however briefly (the reading phase may be short).
WATCH_STATUS = """() => {
  window.statusesSeen = [];
  new MutationObserver(() => {
    document.querySelectorAll('#message-list .status').forEach((s) => {
      if (s.textContent && !window.statusesSeen.includes(s.textContent))
        window.statusesSeen.push(s.textContent);
    });
  }).observe(document.getElementById('message-list'),
             {subtree: true, childList: true, characterData: true});
}"""


def test_reading_phase_and_continue_after_a_capped_answer(
    short_answers, live_web, start_worker, dispatcher, browser_page
):
    start_worker("endings-worker")
    user = user_create(username="reader", password=PASSWORD)
    conversation = conversation_create(owner=user, title="Rivers")
    page = browser_page
    page.set_default_timeout(90_000)
    log_in(page, live_web, "reader")
    page.goto(f"{live_web}/c/{conversation.id}/")
    page.evaluate(WATCH_STATUS)
    page.fill("#composer textarea", "Describe the rivers of Europe one by one, in detail.")
    page.press("#composer textarea", "Enter")

    answers = page.locator("#message-list li.message.assistant:not(.pending)")
    expect(answers).to_have_count(1, timeout=90_000)
    seen = page.evaluate("window.statusesSeen")
    assert any(s.startswith("Reading your question (") and "tokens)…" in s for s in seen), seen
    # 24 tokens cannot describe Europe's rivers: the bubble says why it stopped.
    ending = answers.first.locator(".answer-ending")
    expect(ending).to_contain_text("length limit")
    # A page loaded later still says so (the ending is stored with the answer), and its
    # Continue works the same.
    page.reload()
    expect(ending).to_contain_text("length limit")
    page.wait_for_function("window.sluiceChat && window.sluiceChat.open()")
    continue_button = ending.get_by_role("button", name="Continue")
    continue_button.click()
    # The rest comes as the next answer; the offer moves to it (cut again) or goes away.
    expect(answers).to_have_count(2, timeout=90_000)
    expect(answers.first.locator(".continue-button")).to_have_count(0)
    assert answers.nth(1).locator(".text").inner_text().strip()
