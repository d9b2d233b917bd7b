"""The operations page in headless Chromium while a real dispatcher and a simulated worker
answer a few dozen requests: it shows the worker, answers per second and the line, live.

With SLUICE_SCREENSHOTS=docs it also saves the screenshots docs/operations.md shows."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

from apps.accounts.services import user_create
from apps.chat.models import Message
from apps.chat.services import conversation_create
from tests.conftest import BASE_DIR
from tests.ops.helpers import final_event, submit, until

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REQUESTS = 60
DESKTOP = {"width": 1440, "height": 1000}


def shots_dir(tmp_path: Path) -> Path:
    return BASE_DIR / "docs" if os.environ.get("SLUICE_SCREENSHOTS") == "docs" else tmp_path


def test_the_operations_page_shows_the_service_under_load(
    live_web, dispatcher, start_worker, browser_page, tmp_path
):
    start_worker(
        "w-ops-1",
        engine="simulated",
        slots=2,
        extra=["--sim-first-token-ms", "60", "--sim-decode-ms", "20", "--sim-tokens", "20"],
    )
    admin = user_create(username="operator", password="correct-horse-battery")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    askers = [user_create(username=f"asker{n}", password="correct-horse-battery") for n in range(6)]
    conversations = [conversation_create(owner=a, title="load") for a in askers]

    page = browser_page
    page.set_viewport_size(DESKTOP)
    page.goto(live_web + "/admin/login/?next=/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "correct-horse-battery")
    page.click("main [type=submit]")  # the admin signs in on the site's sign-in page
    page.click("a:has-text('Operations page')")
    expect(page.locator("#workers")).to_contain_text("w-ops-1", timeout=20_000)

    ids = [
        submit(askers[n % 6], conversation=conversations[n % 6], max_tokens=20)
        for n in range(REQUESTS)
    ]
    page.wait_for_function(
        "() => parseInt(document.querySelector('.queue-depth').textContent) > 0",
        timeout=20_000,
    )
    page.wait_for_function(
        "() => parseFloat(document.querySelector('.window-5 .answers-per-s').textContent) > 0",
        timeout=40_000,
    )
    expect(page.locator("#chart-answers canvas").first).to_be_visible()
    expect(page.locator("#workers .status-live")).to_have_count(1)
    shots = shots_dir(tmp_path)
    page.screenshot(path=str(shots / "ops-page.png"), full_page=True)

    until(lambda: all(final_event(i) for i in ids[-5:]), timeout=120)
    until(lambda: Message.objects.filter(request_id=ids[-1]).exists())  # the recorder's turn
    page.goto(f"{live_web}/admin/ops/request/{ids[-1]}/")
    expect(page.locator("tr.step")).to_have_count(7)
    expect(page.locator(".ops-request")).to_contain_text("finished (done)")
    page.screenshot(path=str(shots / "request-inspector.png"), full_page=True)
