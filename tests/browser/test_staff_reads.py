"""Staff and a person, in Chromium on a phone-sized window against a real daphne. Reading their
conversation: staff without the permission are refused, a reader gives a reason before the words
appear, and the owner finds the read and the reason on their privacy page. Suspending them: their
open page ends and sign-in says why."""

from __future__ import annotations

from django.contrib.auth.models import Permission
from playwright.sync_api import expect

from apps.accounts.models import StaffRead
from apps.accounts.services import user_create, user_suspend
from apps.chat.services import conversation_create, message_create
from tests.browser.test_feedback import no_overflow
from tests.browser.test_tools import PASSWORD, log_in, serious_violations

PHONE = {"width": 375, "height": 740}
REASON = "Support ticket 4411: the owner asked us to look at this answer"


def staff_member(username: str, *codenames: str):
    member = user_create(username=username, password=PASSWORD)
    member.is_staff, member.is_superuser = True, False
    member.save()
    member.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return member


def test_a_reader_gives_a_reason_on_a_phone_and_the_owner_sees_it(live_web, browser_page):
    owner = user_create(username="wren", password=PASSWORD)
    conversation = conversation_create(owner=owner, title="Wren's chat")
    message_create(conversation=conversation, role="user", text="What should I do about my rent?")
    message_create(conversation=conversation, role="assistant", text="Talk to your landlord.")
    staff_member("plainstaff", "view_conversation", "view_message")
    staff_member("auditor", "read_others_conversations")
    page = browser_page
    page.set_viewport_size(PHONE)
    url = f"{live_web}/admin/chat/conversation/{conversation.pk}/change/"

    log_in(page, live_web, "plainstaff")
    assert page.goto(url).status == 403
    expect(page.locator("body")).not_to_contain_text("about my rent")
    page.context.clear_cookies()

    log_in(page, live_web, "auditor")
    page.goto(url)
    reason = page.get_by_label("Why do you need to read this?")
    expect(reason).to_be_visible()
    expect(page.locator("body")).not_to_contain_text("about my rent")
    assert serious_violations(page) == []
    no_overflow(page, PHONE["width"])
    reason.fill("because")  # too short: asked again, nothing shown, nothing recorded
    page.get_by_role("button", name="Record the reason and read").click()
    expect(page.get_by_label("Why do you need to read this?")).to_be_visible()
    assert not reason.evaluate("field => field.validity.valid")  # the browser says why first
    assert not StaffRead.objects.exists()
    page.get_by_label("Why do you need to read this?").fill(REASON)
    page.get_by_role("button", name="Record the reason and read").click()
    expect(page.locator("body")).to_contain_text("What should I do about my rent?")
    expect(page.locator("body")).to_contain_text("Talk to your landlord.")
    read = StaffRead.objects.get()
    assert (read.reader_name, read.owner_name, read.reason) == ("auditor", "wren", REASON)
    page.context.clear_cookies()

    log_in(page, live_web, "wren")
    page.goto(live_web + "/accounts/profile/")
    page.get_by_role("link", name="Privacy: when staff read your conversations").click()
    reads = page.locator("#staff-reads")
    expect(reads).to_contain_text(f"conversation {conversation.pk}")
    expect(reads).to_contain_text(REASON)
    expect(reads).not_to_contain_text("auditor")
    assert serious_violations(page) == []
    no_overflow(page, PHONE["width"])


def test_a_suspended_persons_open_page_ends_and_sign_in_says_why(live_web, browser_page):
    person = user_create(username="rook", password=PASSWORD)
    conversation = conversation_create(owner=person, title="Rook's chat")
    page = browser_page
    page.set_viewport_size(PHONE)
    log_in(page, live_web, "rook")
    page.goto(f"{live_web}/c/{conversation.pk}/")
    page.wait_for_function("window.sluiceChat && window.sluiceChat.open()")

    user_suspend(user=person, reason="Spam sent through the API", until=None, by=None)
    expect(page.locator("#connection-state")).to_have_text("Please log in again.")

    page.context.clear_cookies()
    page.goto(live_web + "/accounts/login/")
    page.fill("#id_username", "rook")
    page.fill("#id_password", PASSWORD)
    page.click("main button[type=submit]")
    expect(page.locator("main")).to_contain_text("Your account is suspended")
    expect(page.locator("main")).to_contain_text("Spam sent through the API")
    assert serious_violations(page) == []
    no_overflow(page, PHONE["width"])
