"""A tiny, real OpenID Connect provider for the sign-in tests: django-oauth-toolkit with OIDC
on, its own SQLite database and RSA key, run as a second process on loopback (serve.py). Its
cookies have names of their own: browsers share cookies between ports of one host."""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
STATE = Path(os.environ["OIDC_PROVIDER_STATE"])  # a folder of the test's own

SECRET_KEY = "oidc-provider-for-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "tests.accounts.oidc_provider.urls"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [HERE / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": STATE / "idp.sqlite3"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
SESSION_COOKIE_NAME = "idp_sessionid"
CSRF_COOKIE_NAME = "idp_csrftoken"
LOGIN_URL = "/login/"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": (STATE / "rsa.pem").read_text(),
    "OAUTH2_VALIDATOR_CLASS": "tests.accounts.oidc_provider.claims.ClaimsValidator",
    "SCOPES": {"openid": "OpenID Connect", "profile": "Profile", "email": "Email"},
    "PKCE_REQUIRED": True,
}
