"""Starts the test OpenID Connect provider (tests/accounts/oidc_provider) as a process of its
own on loopback, and signs in there as a browser would."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import httpx

from devstack.stack import free_port
from tests.conftest import BASE_DIR, stop_process, wait_for_http

CLIENT_ID = "sluice-test-client"
CLIENT_SECRET = "sluice-test-secret-0123456789"
PROVIDER_ID = "idp"


def callback_path(provider_id: str = PROVIDER_ID) -> str:
    return f"/accounts/oidc/{provider_id}/login/callback/"


@contextmanager
def oidc_provider(state: Path, *, redirect_uri: str, users: list[dict]):
    """Yields the provider's issuer URL while it runs."""
    port = free_port()
    config = {
        "client": {"id": CLIENT_ID, "secret": CLIENT_SECRET, "redirect_uri": redirect_uri},
        "users": users,
    }
    state.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.accounts.oidc_provider.serve",
            str(port),
            str(state),
            json.dumps(config),
        ],
        cwd=BASE_DIR,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(base + "/o/.well-known/openid-configuration", process)
        yield base + "/o"
    finally:
        stop_process(process)


def provider_settings(issuer: str, *, provider_id: str = PROVIDER_ID) -> dict:
    """SOCIALACCOUNT_PROVIDERS naming the test provider, as settings.accounts builds it."""
    return {
        "openid_connect": {
            "OAUTH_PKCE_ENABLED": True,
            "APPS": [
                {
                    "provider_id": provider_id,
                    "name": "Test IdP",
                    "client_id": CLIENT_ID,
                    "secret": CLIENT_SECRET,
                    "settings": {"server_url": issuer},
                }
            ],
        }
    }


def provider_environment(issuer: str) -> dict[str, str]:
    """The same, as the environment of a web process."""
    return {
        "OIDC_ISSUER_URL": issuer,
        "OIDC_CLIENT_ID": CLIENT_ID,
        "OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "OIDC_PROVIDER_ID": PROVIDER_ID,
        "OIDC_NAME": "Test IdP",
    }


def sign_in_at_provider(authorize_url: str, *, username: str, password: str) -> str:
    """Follows the provider's authorization URL as a browser: its login form, then the
    redirect back; returns the callback URL (with the code) it sends the browser to."""
    with httpx.Client(timeout=30) as browser:
        page = browser.get(authorize_url, follow_redirects=True)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)[1]
        answer = browser.post(
            str(page.url),
            data={
                "csrfmiddlewaretoken": token,
                "username": username,
                "password": password,
                "next": page.url.params.get("next", ""),
            },
            headers={"Referer": str(page.url)},
        )
        while answer.status_code == 302 and "/o/authorize" in answer.headers["Location"]:
            answer = browser.get(httpx.URL(str(answer.url)).join(answer.headers["Location"]))
        assert answer.status_code == 302, answer.text[:500]
        return answer.headers["Location"]
