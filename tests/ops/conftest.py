from __future__ import annotations

from tests.security.conftest import start_web  # noqa: F401  (real web processes with settings)
