"""Settings for a public deployment behind TLS. SECRET_KEY and ALLOWED_HOSTS must come from the
environment."""

from __future__ import annotations

from chatsite.settings.base import *  # noqa: F403
from chatsite.settings.base import env

DEBUG = False
SECRET_KEY = env.str("SECRET_KEY")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS")

SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=True)
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

# Staff hold the keys: the admin refuses them until they have set up a second factor.
SLUICE_STAFF_MFA_REQUIRED = env.bool("SLUICE_STAFF_MFA_REQUIRED", default=True)
