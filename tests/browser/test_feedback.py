"""Thumbs on answers in headless Chromium at phone and desktop widths, by keyboard and by
mouse, each vote checked where it is stored; and the admin's usage pages on a phone. Against
a real daphne; no model is needed: the answers are stored as the recorder stores them."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from apps.accounts.services import user_create
from apps.chat.services import conversation_create, message_create
from apps.usage.models import Feedback
from tests.browser.test_tools import PASSWORD, log_in, serious_violations
from tests.conftest import wait_until
from tests.usage.test_feedback_and_pages import recorded

pytestmark = pytest.mark.browser

WIDTHS = {375: 740, 1280: 800}


@pytest.fixture(autouse=True)
def patient(browser_page):
    """Other people's tests share this machine's cores: slow, not broken."""
    browser_page.set_default_timeout(60_000)
    expect.set_options(timeout=30_000)
    yield
    expect.set_options(timeout=5_000)


def answered_chat(owner):
    """A conversation with two answers the user may vote on."""
    conversation = conversation_create(owner=owner, title="Sky")
    for n, question in enumerate(("Why is the sky blue?", "And red at sunset?")):
        message_create(conversation=conversation, role="user", text=question)
        recorded(owner, f"answer-{n}", conversation=conversation, text=f"Answer {n}.")
    return conversation


def thumbs(page, request_id: str):
    return page.locator(f"form.feedback[action='/api/v1/requests/{request_id}/feedback']")


def tab_to(page, target, *, limit: int = 80) -> None:
    """Presses Tab until `target` has the focus: it must be reachable by keyboard alone."""
    for _ in range(limit):
        if target.evaluate("el => el === document.activeElement"):
            return
        page.keyboard.press("Tab")
    raise AssertionError(f"Tab never reached {target}")


def stored(request_id: str):
    """The vote as stored, waited for: the page posts it in the background."""

    def look():
        row = Feedback.objects.filter(request_id=request_id).first()
        return None if row is None else (row.vote, row.reasons, row.comment)

    return look


def no_overflow(page, width: int) -> None:
    scroll = page.evaluate(
        "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
    )
    assert scroll <= width, f"the page is {scroll} px wide in a {width} px window"


@pytest.mark.parametrize("width", WIDTHS)
def test_thumbs_by_keyboard_and_by_click_are_stored_and_shown_again(live_web, browser_page, width):
    me = user_create(username="rater", password=PASSWORD)
    conversation = answered_chat(me)
    page = browser_page
    page.set_viewport_size({"width": width, "height": WIDTHS[width]})
    log_in(page, live_web, "rater")
    page.goto(f"{live_web}/c/{conversation.id}/")
    first, second = thumbs(page, "answer-0"), thumbs(page, "answer-1")
    up = first.get_by_role("button", name="Good answer")
    down = first.get_by_role("button", name="Bad answer")
    details = first.locator(".feedback-details")
    expect(details).to_be_hidden()

    # Keyboard: Tab to the thumb, Enter to vote; then Tab and Space change it in one press.
    page.locator("body").focus()
    tab_to(page, up)
    page.keyboard.press("Enter")
    expect(up).to_have_attribute("aria-pressed", "true")
    assert wait_until(lambda: stored("answer-0")() == (Feedback.UP, [], ""), what="up-vote")
    tab_to(page, down)
    page.keyboard.press("Space")
    expect(down).to_have_attribute("aria-pressed", "true")
    expect(up).to_have_attribute("aria-pressed", "false")
    assert wait_until(lambda: stored("answer-0")() == (Feedback.DOWN, [], ""), what="down-vote")
    # A down-vote offers the optional reasons and comment, also by keyboard.
    expect(details).to_be_visible()
    tab_to(page, details.locator("input[value=wrong]"))
    page.keyboard.press("Space")
    tab_to(page, details.locator("textarea"))
    page.keyboard.type("It is Rayleigh scattering.")
    tab_to(page, details.locator(".feedback-send"))
    page.keyboard.press("Enter")
    expect(first.locator(".feedback-status")).to_have_text("Thanks.")
    assert wait_until(
        lambda: stored("answer-0")() == (Feedback.DOWN, ["wrong"], "It is Rayleigh scattering."),
        what="the reasons and comment",
    )
    no_overflow(page, width)
    assert serious_violations(page) == [], width

    # Mouse: one click votes, one click on the other thumb changes it, a click on the pressed
    # thumb takes it back.
    second.get_by_role("button", name="Good answer").click()
    assert wait_until(lambda: stored("answer-1")() == (Feedback.UP, [], ""), what="click up")
    second.get_by_role("button", name="Bad answer").click()
    assert wait_until(lambda: stored("answer-1")() == (Feedback.DOWN, [], ""), what="click down")
    second.get_by_role("button", name="Bad answer").click()
    expect(second.locator(".feedback-status")).to_have_text("Vote taken back.")
    assert wait_until(lambda: stored("answer-1")() is None, what="the vote taken back")

    # A reload shows what is stored.
    page.reload()
    expect(first.get_by_role("button", name="Bad answer")).to_have_attribute("aria-pressed", "true")
    expect(first.get_by_role("button", name="Good answer")).to_have_attribute(
        "aria-pressed", "false"
    )
    for button in second.locator("button.feedback-vote").all():
        expect(button).to_have_attribute("aria-pressed", "false")


def test_the_admin_usage_pages_fit_a_phone(live_web, browser_page):
    admin = user_create(username="operator-with-a-long-name", password=PASSWORD)
    admin.is_staff = admin.is_superuser = True
    admin.save()
    people = [
        user_create(username=f"person-{n}-with-a-rather-long-username", password=PASSWORD)
        for n in range(3)
    ]
    for n, person in enumerate(people):
        recorded(person, f"usage-{n}", conversation=conversation_create(owner=person))
    page = browser_page
    log_in(page, live_web, admin.username)

    page.goto(f"{live_web}/admin/ops/usage/?days=7")
    expect(page.get_by_role("heading", name="Top users")).to_be_visible()
    expect(page.locator("body")).to_contain_text(people[0].username)
    no_overflow(page, 375)

    # Filtered by one user: their use against the plan's limits, on the same page.
    page.goto(f"{live_web}/admin/ops/usage/?days=7&user={people[0].username}")
    expect(page.locator(".usage-limits")).to_contain_text("against the")
    no_overflow(page, 375)

    # And on the user's own admin page.
    page.goto(f"{live_web}/admin/accounts/user/{people[0].pk}/change/")
    panel = page.locator(".usage-limits")
    expect(panel).to_contain_text(f"{people[0].username} against the")
    box = panel.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 375
    no_overflow(page, 375)
