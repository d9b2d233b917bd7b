from __future__ import annotations

import os
import shutil
import tempfile

import pytest

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")


@pytest.fixture
def browser_page(monkeypatch):
    """A fresh page in Debian's headless Chromium, driven by Playwright."""
    if not shutil.which(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}: `apt-get install chromium` (.ci/run does)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API refuses to run inside a running event loop; Django's async-unsafe
    # guard would trip on it too.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    profile = tempfile.mkdtemp(prefix="sluice-chromium-")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-background-networking",
                "--disable-gpu",
                "--disable-component-update",
                "--no-first-run",
                "--disable-sync",
            ],
        )
        context = browser.new_context(viewport={"width": 375, "height": 740})
        page = context.new_page()
        page.set_default_timeout(20_000)
        try:
            yield page
        finally:
            context.close()
            browser.close()
            shutil.rmtree(profile, ignore_errors=True)
