"""Memory on the page, in headless Chromium at 375 px, against a real daphne, a real worker
running SmolLM2 and the dispatcher: follow-up questions arrive as chips under the answer (a
background request, delivered through the inbox) and send their question when clicked; a
message can be pinned and stays pinned after a reload."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from apps.admission.models import DegradationSettings

pytestmark = pytest.mark.browser


@pytest.fixture
def followups_on(monkeypatch, settings, transactional_db):
    # Read from the environment by the web and dispatcher processes started after this.
    monkeypatch.setenv("SLUICE_FOLLOWUPS", "1")
    settings.SLUICE_FOLLOWUPS = True
    # Background work is refused while the service degrades; a busy test machine must not
    # count as that here (the dispatcher's own tests cover it).
    row = DegradationSettings.current()
    row.forced_level = 0
    row.save()


def log_in(page, base_url: str) -> None:
    page.goto(base_url + "/accounts/login/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "correct-horse-battery")
    page.click("button[type=submit]")


def test_follow_up_chips_send_their_question_and_pins_stay(
    followups_on, short_answers, user, live_web, start_worker, dispatcher, browser_page
):
    start_worker("memory-worker")
    page = browser_page
    log_in(page, live_web)
    page.goto(live_web + "/c/new/")  # a new chat: stored with its first question
    page.fill("textarea[name=text]", "What is a sluice gate?")
    page.click("form.composer button[type=submit]")
    expect(page.locator(".message.assistant .text").first).not_to_be_empty(timeout=120_000)
    expect(page.locator(".message.assistant.pending")).to_have_count(0, timeout=120_000)

    # The suggestions come after the answer, from a background request behind any person's.
    chips = page.locator(".message.assistant .followups .followup-chip")
    expect(chips.first).to_be_visible(timeout=240_000)
    assert 1 <= chips.count() <= 3
    suggested = chips.first.inner_text()
    assert suggested.endswith("?") and suggested != "What is a sluice gate?"
    assert page.evaluate("document.documentElement.scrollWidth") <= 375

    chips.first.click()
    expect(page.locator(".message.user")).to_have_count(2, timeout=30_000)
    expect(page.locator(".message.user").nth(1)).to_contain_text(suggested)
    expect(page.locator(".message.assistant.pending")).to_have_count(0, timeout=240_000)

    # Pin the first question: the button says so at once, and after a reload.
    page.reload()
    first = page.locator(".message.user").first
    first.locator(".pin-button").click()
    expect(first.locator(".pin-button")).to_have_text("Unpin")
    page.reload()
    first = page.locator(".message.user").first
    expect(first.locator(".pin-button")).to_have_attribute("aria-pressed", "true")
    assert page.evaluate("document.documentElement.scrollWidth") <= 375


@pytest.fixture
def small_window(monkeypatch, settings):
    # Read by the web process started after this: a long chat overflows it, so the page's
    # note shows the memory block the next prompt holds.
    monkeypatch.setenv("MODEL_CONTEXT_TOKENS", "900")
    monkeypatch.setenv("MODEL_MAX_TOKENS", "100")
    settings.MODEL_CONTEXT_TOKENS, settings.MODEL_MAX_TOKENS = 900, 100


def test_what_i_remember_is_corrected_and_deleted_on_the_page(
    small_window, user, live_web, browser_page
):
    from apps.chat.services import conversation_create, message_create

    conversation = conversation_create(owner=user, title="Moving house")
    said = ["I live in Tallinn.", "My boss has a cat called Mochi."]
    for n, text in enumerate(
        [*said, *(f"Tell me about river {n} and its banks." for n in range(24))]
    ):
        message_create(conversation=conversation, role="user", text=text)
        message_create(
            conversation=conversation,
            role="assistant",
            request_id=f"a{n}",
            text=f"River {n} runs past farms and mills; its banks are " + "mud " * 20,
        )
    page = browser_page
    log_in(page, live_web)
    page.goto(f"{live_web}/c/{conversation.id}/")
    note = page.locator("#memory-note")
    note.locator("summary").click()
    # The user's own words, as said; the entry's key names the statement.
    city = note.locator(".memory-entry", has_text="I live in Tallinn.")
    expect(city.locator(".memory-fact")).to_have_text('"I live in Tallinn."')
    key = city.get_attribute("data-key")
    city.locator("input[name=value]").fill("I live in Tartu.")
    city.locator("button[value=save]").click()

    # Back with the note open: the entry holds the correction, as the next prompt will.
    note = page.locator("#memory-note")
    expect(note).to_have_attribute("open", "")
    city = note.locator(f'.memory-entry[data-key="{key}"]')
    expect(city.locator(".memory-fact")).to_have_text(
        '"I live in Tartu." (as the user corrected it)'
    )
    boss = note.locator(".memory-entry", has_text="boss has a cat called Mochi")
    boss.locator("button[value=delete]").click()
    expect(page.locator("#memory-note .memory-entry", has_text="Mochi")).to_have_count(0)
    expect(page.locator(f'#memory-note .memory-entry[data-key="{key}"]')).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
