"""Search from the sidebar, and messages Sluice starts itself, in headless Chromium on a
phone-sized screen against a real daphne (no model needed: the chats are stored directly, and
a question sent from a follow-up chip only has to reach the conversation)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from apps.accounts.services import user_create
from apps.chat.services import conversation_create, message_create
from apps.inbox import services as inbox

pytestmark = pytest.mark.browser

PASSWORD = "a-long-passphrase-9"


def chat(owner, title: str, question: str, answer: str):
    conversation = conversation_create(owner=owner, title=title)
    message_create(conversation=conversation, role="user", text=question)
    answered = message_create(
        conversation=conversation, role="assistant", text=answer, request_id=f"{title}-answer"
    )
    return conversation, answered


def log_in(page, base_url: str, username: str, next_path: str = "") -> None:
    page.goto(base_url + "/accounts/login/" + (f"?next={next_path}" if next_path else ""))
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")


def test_search_my_chats_from_the_sidebar(live_web, browser_page):
    me = user_create(username="searcher", password=PASSWORD)
    other = user_create(username="someone", password=PASSWORD)
    garden, _ = chat(
        me,
        "Garden",
        "How deep do I plant tomatoes?",
        "Bury <b>tomatoes</b> up to their first leaves.",
    )
    chat(me, "Taxes", "When are taxes due?", "In April.")
    chat(other, "Their tomatoes", "Secret tomatoes?", "Yes.")
    page = browser_page
    log_in(page, live_web, "searcher")
    page.goto(f"{live_web}/c/{garden.id}/")
    if page.locator("#nav-toggle").is_visible() or page.locator(".nav-toggle-label").is_visible():
        page.locator(".nav-toggle-label").click()  # the sidebar folds away on a phone

    page.fill("#search-input", "tomatoes")
    hits = page.locator("#search-results .search-hit")
    expect(hits).to_have_count(1)  # only my own chats
    expect(hits.first).to_contain_text("Garden")
    expect(hits.first.locator("mark").first).to_have_text("tomatoes", ignore_case=True)
    # Model text never becomes markup: the only element in a snippet is the highlight.
    assert hits.first.locator(".search-snippet *:not(mark)").count() == 0

    page.fill("#search-input", "volcanoes")
    expect(page.locator("#search-results")).to_contain_text("No chat matches")

    page.fill("#search-input", "april")
    expect(hits.first).to_contain_text("Taxes")
    hits.first.locator("a").click()
    expect(page.locator(".message.assistant .text").first).to_contain_text("In April.")
    assert page.evaluate("document.documentElement.scrollWidth") <= 375


def test_inbox_notes_and_follow_up_chips_arrive_live(live_web, browser_page):
    me = user_create(username="asker", password=PASSWORD)
    conversation, answer = chat(me, "Rivers", "Where do rivers start?", "In the mountains.")
    # Unread when the page opens: the inbox socket brings it once it follows the live ones.
    inbox.inbox_post(user_id=me.id, kind="announcement", text="Welcome back")
    page = browser_page
    # Straight to the conversation: a page shown on the way would show the note and mark it read.
    log_in(page, live_web, "asker", next_path=f"/c/{conversation.id}/")
    expect(page).to_have_url(f"{live_web}/c/{conversation.id}/")
    expect(page.locator(".message.assistant")).to_have_count(1)
    notes = page.locator(".inbox-note.announcement")
    expect(notes).to_contain_text("Welcome back")

    inbox.inbox_post(user_id=me.id, kind="announcement", text="Maintenance at <i>six</i>")
    expect(notes.last).to_contain_text("Maintenance at <i>six</i>")

    inbox.inbox_post(
        user_id=me.id,
        kind="followups",
        text="Suggested follow-up questions",
        data={
            "conversation_id": conversation.id,
            "message_id": answer.id,
            "request_id": answer.request_id,
            "questions": ["Which river is longest?", "How do deltas form?"],
        },
    )
    chips = page.locator(f"li[data-message-id='{answer.id}'] .followup-chip")
    expect(chips).to_have_count(2)
    chips.first.click()
    expect(page.locator(".message.user").last).to_contain_text("Which river is longest?")
    expect(page.locator(".followup-chip")).to_have_count(0)
