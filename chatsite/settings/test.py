"""Settings for pytest. `make test` starts embedded PostgreSQL and Redis and exports their URLs."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from chatsite.settings.base import *  # noqa: F403

if not os.environ.get("DATABASE_URL") or not os.environ.get("REDIS_URL"):
    raise ImproperlyConfigured(
        "Tests need DATABASE_URL and REDIS_URL. Run `make test`, which starts embedded "
        "PostgreSQL and Redis and sets both."
    )

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Tests that need the embedding model load it themselves; other tests should not pay for it.
RAG_WARM_UP = False
# Background follow-ups and tag proposals would add requests to every test's queue; the tests
# of those features turn them on (processes read these from their environment).
SLUICE_FOLLOWUPS = env.bool("SLUICE_FOLLOWUPS", default=False)  # noqa: F405
SLUICE_TAG_PROPOSAL_EVERY = env.int("SLUICE_TAG_PROPOSAL_EVERY", default=0)  # noqa: F405
SLUICE_TITLES = env.bool("SLUICE_TITLES", default=False)  # noqa: F405
# Sign-ups in tests need no mail unless a test asks for the verified flow (tests/accounts);
# processes started by tests read it from their environment.
SLUICE_EMAIL_VERIFICATION = env.str("SLUICE_EMAIL_VERIFICATION", default="off")  # noqa: F405
vars().update(email_verification(SLUICE_EMAIL_VERIFICATION))  # noqa: F405
