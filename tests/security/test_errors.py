"""Items 10 and 11: what a visitor sees when something goes wrong. `make run`'s settings show no
debug page to anyone; an oversized body is a 413; an outage of Redis or PostgreSQL is a 503 with
a clear message (JSON under /api/, a page for people), never a 500 with a traceback."""

from __future__ import annotations

import httpx
import pytest
from django.urls import reverse

from apps.accounts.services import api_key_create
from apps.chat.services import conversation_create
from devstack.stack import free_port
from tests.security.conftest import logged_in

pytestmark = pytest.mark.django_db(transaction=True)

THREE_MB = 3 * 1024 * 1024
LEAKS = ("Traceback", "DATABASES", "REDIS_URL", "INSTALLED_APPS", "SECRET_KEY", "URLconf")


def assert_no_debug_page(response: httpx.Response) -> None:
    for leak in LEAKS:
        assert leak not in response.text, f"{leak} shown to an anonymous visitor"


def test_make_run_settings_show_no_debug_page_to_anyone(start_web, user):
    """chatsite.settings.dev as `make run` uses it, with DEBUG left unset."""
    base = start_web(DJANGO_SETTINGS_MODULE="chatsite.settings.dev", DEBUG=None, RAG_WARM_UP="0")
    with httpx.Client(base_url=base, timeout=30) as http:
        unknown = http.get("/no/such/page/")
        assert unknown.status_code == 404
        assert_no_debug_page(unknown)
        assert "api/v1/" not in unknown.text and "admin/" not in unknown.text

        login = http.get("/accounts/login/")
        assert login.status_code == 200  # pages still work over plain http
        assert http.get("/static/css/sluice.css").status_code == 200
        huge = http.post(
            "/accounts/login/",
            data={
                "csrfmiddlewaretoken": login.cookies.get("csrftoken", ""),
                "username": "alice",
                "password": "x" * THREE_MB,
            },
        )
        assert huge.status_code == 413
        assert_no_debug_page(huge)

        _, raw = api_key_create(user=user, name="tests")
        api = http.post(
            "/api/v1/requests",
            content=b'{"text": "' + b"x" * THREE_MB + b'"}',
            headers={"Authorization": f"Bearer {raw}", "Content-Type": "application/json"},
        )
        assert api.status_code == 413
        assert "too large" in api.json()["error"]


@pytest.mark.parametrize(
    ("path", "data"),
    [
        ("/accounts/login/", {"username": "alice", "password": "x" * THREE_MB}),
        ("/accounts/signup/", {"username": "x" * THREE_MB}),
    ],
)
def test_an_oversized_form_is_a_413_page(client, path, data):
    response = client.post(path, data)
    assert response.status_code == 413
    assert b"too large" in response.content and b"<html" in response.content


def test_an_oversized_api_body_is_a_413_in_the_apis_error_shape(client, user):
    _, raw = api_key_create(user=user, name="tests")
    response = client.post(
        "/api/v1/requests",
        b'{"text": "' + b"x" * THREE_MB + b'"}',
        content_type="application/json",
        headers={"Authorization": f"Bearer {raw}"},
    )
    assert response.status_code == 413
    assert "too large" in response.json()["error"]


def test_unknown_api_urls_answer_in_the_apis_error_shape(client):
    response = client.get("/api/v1/no-such-thing")
    assert response.status_code == 404
    assert response.json() == {"error": "There is nothing here."}


def assert_unavailable(response: httpx.Response, *, json_body: bool) -> None:
    assert response.status_code == 503, response.text[:500]
    assert int(response.headers["Retry-After"]) > 0
    assert_no_debug_page(response)
    if json_body:
        assert "try again" in response.json()["error"]
    else:
        assert "try again" in response.text and "<html" in response.text


def test_a_redis_outage_is_a_503_everywhere_not_a_500(start_web, user):
    conversation = conversation_create(owner=user)
    _, raw = api_key_create(user=user, name="tests")
    _, session_key = logged_in(user)
    base = start_web(REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    api = {"Authorization": f"Bearer {raw}"}
    with httpx.Client(base_url=base, timeout=30) as http:
        for method, path in [
            ("GET", "/api/v1/requests/0123456789abcdef"),
            ("GET", "/api/v1/requests/0123456789abcdef/events"),
            ("POST", "/api/v1/requests/0123456789abcdef/cancel"),
            ("POST", "/api/v1/requests"),
        ]:
            response = http.request(method, path, headers=api, json={"text": "hello"})
            assert_unavailable(response, json_body=True)
        # The OpenAI-compatible API says so in OpenAI's error shape, which its clients retry.
        hello = [{"role": "user", "content": "hello"}]
        for path, body in (
            ("/v1/chat/completions", {"model": "m", "messages": hello}),
            ("/v1/responses", {"model": "m", "input": hello}),
        ):
            response = http.post(path, headers=api, json=body)
            assert response.status_code == 503, response.text[:500]
            assert int(response.headers["Retry-After"]) > 0
            assert "try again" in response.json()["error"]["message"]

        http.cookies.set("sessionid", session_key)
        page = http.get(reverse("chat:conversation", args=[conversation.id]))
        assert_unavailable(page, json_body=False)
        assert_unavailable(failed_login(http), json_body=False)

        health = http.get("/health/")
        assert health.status_code == 503
        assert health.json()["database"] == "ok" and health.json()["redis"] != "ok"


def failed_login(http: httpx.Client) -> httpx.Response:
    """A login attempt (the throttle lives in Redis), from a fresh anonymous browser."""
    http.cookies.clear()
    form = http.get("/accounts/login/")
    return http.post(
        "/accounts/login/",
        data={
            "csrfmiddlewaretoken": form.cookies.get("csrftoken", ""),
            "username": "alice",
            "password": "wrong",
        },
    )


def test_a_database_outage_is_a_503_not_a_500(start_web, user):
    conversation = conversation_create(owner=user)
    _, raw = api_key_create(user=user, name="tests")
    _, session_key = logged_in(user)
    base = start_web(
        DATABASE_URL=f"postgres://sluice@127.0.0.1:{free_port()}/sluice", DATABASE_POOL_TIMEOUT="1"
    )
    with httpx.Client(base_url=base, timeout=30) as http:
        response = http.post(
            "/api/v1/requests", json={"text": "hello"}, headers={"Authorization": f"Bearer {raw}"}
        )
        assert_unavailable(response, json_body=True)

        http.cookies.set("sessionid", session_key)
        page = http.get(reverse("chat:conversation", args=[conversation.id]))
        assert_unavailable(page, json_body=False)

        health = http.get("/health/")
        assert health.status_code == 503
        assert health.json()["redis"] == "ok" and health.json()["database"] != "ok"
