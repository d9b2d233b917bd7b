"""The chat page's everyday tools in headless Chromium, against a real daphne (and, where an
answer is needed, a real worker and the dispatcher): following the answer, copy, edit, dark
mode, shortcuts, tabs in step, and an axe-core check of the chat and profile pages at 1280 and
375 px. With SLUICE_SCREENSHOTS=<folder> set, the page is also photographed there in light and
dark at both widths (docs/chat-*.png come from `SLUICE_SCREENSHOTS=docs`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect

from apps.accounts.services import user_create
from apps.chat.services import conversation_create, message_create

pytestmark = pytest.mark.browser

AXE = Path(__file__).parent / "vendor" / "axe.min.js"
PASSWORD = "a-long-passphrase-9"
WIDTHS = {1280: 800, 375: 740}

CODE_ANSWER = """Use slicing, or `reversed()` for an iterator:

```python
numbers = [1, 2, 3]
backwards = numbers[::-1]  # a new list
print(backwards)
```

`list.reverse()` reverses **in place** and returns `None`."""


@pytest.fixture(autouse=True)
def patient(browser_page):
    """Eight people share two cores this afternoon: slow, not broken."""
    browser_page.set_default_timeout(60_000)
    browser_page.set_default_navigation_timeout(90_000)
    expect.set_options(timeout=30_000)
    yield
    expect.set_options(timeout=5_000)


def log_in(page, base: str, username: str) -> None:
    page.goto(base + "/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("main button[type=submit]")
    page.wait_for_url(lambda url: "/accounts/login/" not in url)


def long_conversation(owner, turns: int = 8, title: str = "Reversing a list"):
    conversation = conversation_create(owner=owner, title=title)
    for n in range(turns):
        message_create(conversation=conversation, role="user", text=f"Question {n}: how?")
        message_create(conversation=conversation, role="assistant", text=CODE_ANSWER)
    message_create(
        conversation=conversation, role="user", text="How do I reverse a list in Python?"
    )
    message_create(conversation=conversation, role="assistant", text=CODE_ANSWER)
    return conversation


def at_bottom(page) -> bool:
    """Whether the message list shows its end (a wait: the last layout may still be coming)."""
    try:
        page.wait_for_function(
            "(() => { const l = document.getElementById('message-list');"
            " return l.scrollHeight - l.scrollTop - l.clientHeight < 50; })()",
            timeout=5_000,
        )
    except PlaywrightTimeout:
        return False
    return True


def in_viewport(page, selector: str) -> bool:
    return page.evaluate(
        "(s) => { const r = document.querySelector(s).getBoundingClientRect();"
        " return r.top >= 0 && r.bottom <= window.innerHeight; }",
        selector,
    )


def serious_violations(page) -> list[str]:
    page.add_script_tag(path=str(AXE))
    found = page.evaluate(
        "async () => (await axe.run(document)).violations"
        ".filter(v => v.impact === 'serious' || v.impact === 'critical')"
        ".map(v => v.id + ' (' + v.impact + '): ' + v.nodes.slice(0, 3)"
        ".map(n => n.target.join(' ')).join(', '))"
    )
    return found


def test_copy_dark_mode_shortcuts_scrolling_and_axe(live_web, browser_page):
    walker = user_create(username="walker", password=PASSWORD)
    conversation = long_conversation(walker)
    page = browser_page
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_web)
    log_in(page, live_web, "walker")
    page.goto(f"{live_web}/c/{conversation.id}/")

    # A reload lands on the latest message, with the composer in view.
    expect(page.locator(".message.assistant .copy-answer").last).to_be_visible()
    assert at_bottom(page) and in_viewport(page, "#composer textarea")
    # Scrolled up: a "Jump to latest" button, which brings the view back down.
    jump = page.locator("#jump-latest")
    expect(jump).to_be_hidden()
    page.evaluate("document.getElementById('message-list').scrollTop = 0")
    expect(jump).to_be_visible()
    jump.click()
    expect(jump).to_be_hidden()
    assert at_bottom(page)

    # Copy a code block, then the whole answer.
    last = page.locator(".message.assistant").last
    last.locator(".code-copy").click()
    expect(last.locator(".code-copy")).to_have_text("Copied")
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied.startswith("numbers = [1, 2, 3]") and "Copy" not in copied
    last.locator(".copy-answer").click()
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied.startswith("Use slicing") and "returns None." in copied
    assert "Copy code" not in copied
    # Highlighted by Pygments on the server.
    expect(last.locator("code .k, code .nb, code .c1").first).to_be_visible()

    # Dark mode follows the system until the toggle is used; the pick is remembered.
    page.emulate_media(color_scheme="dark")
    page.reload()
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    toggle = page.locator("#theme-toggle")
    expect(toggle).to_have_attribute("aria-pressed", "true")
    toggle.click()
    assert page.evaluate("document.documentElement.dataset.theme") == "light"
    page.reload()
    assert page.evaluate("document.documentElement.dataset.theme") == "light"
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(247, 247, 248)"
    toggle.click()  # back to the system's (dark)
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") != background

    # Shortcuts: the help dialog, focus the composer, new chat.
    page.keyboard.press("Control+/")
    expect(page.locator("#help-dialog")).to_be_visible()
    expect(page.locator("#help-dialog")).to_contain_text("New chat")
    page.keyboard.press("Escape")
    expect(page.locator("#help-dialog")).to_be_hidden()
    page.locator(".copy-answer").last.focus()
    page.keyboard.press("Shift+Escape")
    assert page.evaluate("document.activeElement.name") == "text"

    # No serious or critical accessibility problem, light and dark, at both widths, and the
    # composer stays in view at each width.
    shots = os.environ.get("SLUICE_SCREENSHOTS")
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for width, height in WIDTHS.items():
            page.set_viewport_size({"width": width, "height": height})
            for path in (f"/c/{conversation.id}/", "/c/new/", "/accounts/profile/"):
                page.goto(live_web + path)
                page.evaluate("localStorage.removeItem('sluice-theme')")
                page.reload()
                assert page.evaluate("document.documentElement.dataset.theme") == scheme
                assert serious_violations(page) == [], (path, width, scheme)
                assert page.evaluate("document.documentElement.scrollWidth") <= width
            page.goto(f"{live_web}/c/{conversation.id}/")
            assert in_viewport(page, "#composer textarea") and at_bottom(page)
            if shots:
                page.screenshot(path=str(Path(shots) / f"chat-{scheme}-{width}.png"))

    # Every control is reached with Tab alone.
    reached = set()
    page.locator("body").focus()
    for _ in range(200):
        page.keyboard.press("Tab")
        reached.add(page.evaluate("document.activeElement.id || document.activeElement.className"))
    # (at 375 px: the sidebar opens from the "Chats" checkbox)
    wanted = {
        "theme-toggle",
        "link help-button",
        "nav-toggle",
        "copy-answer",
        "code-copy",
        "edit-message",
        "send-button",
        "regenerate-button",
    }
    assert wanted <= reached, wanted - reached

    # Ctrl+Shift+O opens a new chat.
    page.keyboard.press("Control+Shift+O")
    page.wait_for_url("**/c/new/")
    expect(page.locator("#new-chat-form textarea")).to_be_visible()


def test_tabs_in_step_and_a_chat_created_by_its_first_question(live_web, browser_page):
    walker = user_create(username="walker", password=PASSWORD)
    here = conversation_create(owner=walker, title="Here")
    message_create(conversation=here, role="user", text="Old question")
    message_create(conversation=here, role="assistant", text="Old answer")
    doomed = conversation_create(owner=walker, title="Doomed")
    tab_a = browser_page
    log_in(tab_a, live_web, "walker")
    tab_b = tab_a.context.new_page()
    tab_b.goto(f"{live_web}/c/{here.id}/")
    tab_b.wait_for_function("window.sluiceChat && window.sluiceChat.open()")

    # A question sent in a new chat from one tab: the chat exists only now, named after it,
    # and the other tab's sidebar shows it at once.
    tab_a.goto(live_web + "/c/new/")
    expect(tab_a.locator("#sidebar .conversation-list")).not_to_contain_text("New chat")
    tab_a.fill("#new-chat-form textarea", "what is a sluice gate?")
    tab_a.keyboard.press("Enter")
    tab_a.wait_for_url("**/c/*/")
    expect(tab_a.locator(".message.user")).to_contain_text("what is a sluice gate?")
    expect(tab_b.locator("#sidebar .conversation-list li").first).to_have_text(
        "What is a sluice gate"
    )
    # Rename and delete in one tab; the other follows.
    tab_a.goto(f"{live_web}/c/{here.id}/")
    tab_a.click(".rename summary")
    tab_a.fill(".rename input[name=title]", "Renamed here")
    tab_a.click(".rename button[type=submit]")
    expect(tab_b.locator(".conversation-header h1")).to_have_text("Renamed here")
    tab_a.goto(f"{live_web}/c/{doomed.id}/")
    tab_a.once("dialog", lambda dialog: dialog.accept())
    tab_a.click(".conversation-header button.danger")
    expect(tab_b.locator("#sidebar")).not_to_contain_text("Doomed")

    # An edit in one tab replaces the old branch in both.
    sockets = []
    tab_a.on("websocket", lambda socket: sockets.append(socket))
    tab_a.goto(f"{live_web}/c/{here.id}/")
    tab_a.locator(".message.user .edit-message").first.click()
    box = tab_a.locator(".edit-form textarea")
    expect(box).to_be_focused()
    box.fill("New question")
    tab_a.keyboard.press("Enter")
    for tab in (tab_a, tab_b):
        expect(tab.locator(".message.user")).to_have_count(1)
        expect(tab.locator(".message.user")).to_contain_text("New question")
        expect(tab.locator("#message-list")).not_to_contain_text("Old answer")
        expect(tab.locator(".message.assistant.pending")).to_have_count(1)

    # Esc stops the answer in progress (no worker runs here: the stop request is what counts).
    tab_a.locator("#composer textarea").focus()
    chat_socket = [socket for socket in sockets if "/ws/chat/" in socket.url][-1]
    with chat_socket.expect_event("framesent", predicate=lambda data: '"stop"' in str(data)):
        tab_a.keyboard.press("Escape")


def test_the_answer_is_followed_unless_the_reader_scrolls_up(
    short_answers, live_web, start_worker, dispatcher, browser_page
):
    start_worker("tools-worker")
    walker = user_create(username="walker", password=PASSWORD)
    conversation = long_conversation(walker, turns=4)
    page = browser_page
    log_in(page, live_web, "walker")
    page.goto(f"{live_web}/c/{conversation.id}/")

    # At the bottom: the streaming answer stays in view. (A short answer may end between two
    # looks, so the new bubble is found by its place, pending or not.)
    answers_before = page.locator(".message.assistant").count()
    page.fill("#composer textarea", "Say hello.")
    page.keyboard.press("Enter")
    newest = page.locator(".message.assistant").nth(answers_before)
    expect(newest.locator(".text")).not_to_be_empty(timeout=120_000)
    assert at_bottom(page)
    expect(page.locator(".message.assistant.pending")).to_have_count(0, timeout=120_000)
    assert at_bottom(page)

    # Edited while scrolled up: the view stays where the reader put it.
    page.locator(".message.user .edit-message").last.click()
    page.fill(".edit-form textarea", "Say goodbye.")
    page.keyboard.press("Enter")
    expect(page.locator(".message.assistant.pending")).to_have_count(1)
    page.evaluate("document.getElementById('message-list').scrollTop = 0")
    expect(page.locator(".message.assistant.pending")).to_have_count(0, timeout=120_000)
    assert page.evaluate("document.getElementById('message-list').scrollTop") < 50
    expect(page.locator("#jump-latest")).to_be_visible()
    page.locator("#jump-latest").click()
    assert at_bottom(page)
    expect(page.locator(".message.user").last).to_contain_text("Say goodbye.")
    expect(page.locator("#message-list")).not_to_contain_text("Say hello.")


def test_text_that_lands_before_the_scroll_event_keeps_the_reader_where_they_went(
    live_web, browser_page
):
    """A scroll event comes a frame after the scroll: a delta that lands in between used to see
    the reader still "at the bottom" and pull them back down."""
    walker = user_create(username="walker", password=PASSWORD)
    conversation = long_conversation(walker)
    page = browser_page
    log_in(page, live_web, "walker")
    page.goto(f"{live_web}/c/{conversation.id}/")
    assert at_bottom(page)
    page.evaluate(
        "() => { const list = document.getElementById('message-list');"
        " list.scrollTop = 0;"  # the reader moves up, and in the same frame text arrives
        " list.querySelector('.message.assistant:last-child .text')"
        "     .appendChild(document.createTextNode(' and one more thing')); }"
    )
    # The observer runs at once; the scroll event in the next frame, before that frame's
    # animation callbacks: two frames on, both have had their say.
    page.evaluate(
        "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"
    )
    assert page.evaluate("document.getElementById('message-list').scrollTop") < 50
    expect(page.locator("#jump-latest")).to_be_visible()
    # Back at the bottom, new text is followed again.
    page.locator("#jump-latest").click()
    page.evaluate(
        "() => document.getElementById('message-list')"
        "  .querySelector('.message.assistant:last-child .text')"
        "  .appendChild(document.createTextNode(' and another'))"
    )
    assert at_bottom(page)
