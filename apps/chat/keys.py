from __future__ import annotations

from django.conf import settings

from worker.protocol import Keys


def keys() -> Keys:
    """Redis names under this deployment's (or this test's) prefix."""
    return Keys(prefix=settings.SLUICE_REDIS_PREFIX)
