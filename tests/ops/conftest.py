from __future__ import annotations

from tests.admission.conftest import admission, clock, make_dispatcher  # noqa: F401
from tests.browser.conftest import browser_page  # noqa: F401  (headless Chromium)
from tests.security.conftest import start_web  # noqa: F401  (real web processes with settings)
