"""Helpers for the security tests: real web processes with chosen settings, websockets opened
the way a browser would, and logged-in sessions whose cookies both can use."""

from __future__ import annotations

import subprocess
from contextlib import asynccontextmanager
from html.parser import HTMLParser

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.hashers import make_password
from django.contrib.sessions.models import Session
from django.db import connections
from django.test import Client
from django.utils import timezone

from apps.accounts.models import User
from devstack.stack import free_port, web_command
from tests.conftest import BASE_DIR, process_env, stop_process, wait_for_http


@pytest.fixture
def start_web(transactional_db, redis_prefix):
    """Starts daphne serving Sluice with the given environment changes (None removes a
    variable); returns its base URL. Stopped after the test."""
    started: list[subprocess.Popen] = []

    def start(**changes: str | None) -> str:
        env = process_env(redis_prefix)
        for name, value in changes.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        port = free_port()
        process = subprocess.Popen(web_command("127.0.0.1", port), cwd=BASE_DIR, env=env)
        started.append(process)
        base_url = f"http://127.0.0.1:{port}"
        wait_for_http(base_url + "/health/", process)
        return base_url

    yield start
    for process in started:
        stop_process(process)


@pytest.fixture
async def close_thread_connections():
    """ORM calls made through sync_to_async open a connection in asgiref's worker thread; closed
    there, so that the test database can be dropped at the end of the session."""
    yield
    await sync_to_async(connections.close_all)()


NEW_PASSWORD = "a-brand-new-passphrase-7"


def end_without_event(how: str, *, user_id: int, session_key: str) -> None:
    """Ends the session as a shell or another process could, with no account event."""
    if how == "session deleted":
        Session.objects.filter(session_key=session_key).delete()
    elif how == "session expired":
        Session.objects.filter(session_key=session_key).update(expire_date=timezone.now())
    elif how == "password changed":
        User.objects.filter(pk=user_id).update(password=make_password(NEW_PASSWORD))
    elif how == "user deactivated":
        User.objects.filter(pk=user_id).update(is_active=False)
    else:
        raise ValueError(how)


def logged_in(user) -> tuple[Client, str]:
    """A client logged in as `user` (a session of its own) and its session key."""
    client = Client()
    client.force_login(user)
    return client, client.cookies["sessionid"].value


@asynccontextmanager
async def websocket(
    path: str,
    *,
    session_key: str | None = None,
    origin: str | None = "http://testserver",
    host: str = "testserver",
    scheme: str | None = None,
):
    """A websocket to the real ASGI application (origin check, session auth, consumer), with
    the headers a browser on `origin` would send; yields (communicator, accepted, close code)."""
    from chatsite.asgi import application

    headers = [(b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    if session_key is not None:
        headers.append((b"cookie", f"sessionid={session_key}".encode()))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    if scheme is not None:
        communicator.scope["scheme"] = scheme  # as daphne sets it: "ws" or "wss"
    accepted, code = await communicator.connect(timeout=10)
    try:
        yield communicator, accepted, code
    finally:
        await communicator.disconnect()


async def closed_with(communicator, *, timeout: float = 10) -> int | None:
    """Reads what the server sends until it closes the socket; the close code."""
    while True:
        message = await communicator.receive_output(timeout=timeout)
        if message["type"] == "websocket.close":
            return message.get("code")


class FormFields(HTMLParser):
    """The fields a browser would submit from a page's <form id=...>: inputs (checkboxes only
    when checked), selected options, textareas."""

    def __init__(self, form_id: str) -> None:
        super().__init__()
        self.form_id = form_id
        self.fields: list[tuple[str, str]] = []
        self._in_form = self._done = False
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = {name: value or "" for name, value in attrs}
        if self._done:
            return
        if tag == "form" and attrs.get("id") == self.form_id:
            self._in_form = True
        if not self._in_form or ("name" not in attrs and tag != "option"):
            return
        if tag == "input":
            kind = attrs.get("type", "text").lower()
            if kind in ("checkbox", "radio") and "checked" not in attrs:
                return
            if kind not in ("submit", "button", "file"):
                self.fields.append(
                    (attrs["name"], attrs.get("value", "on" if kind == "checkbox" else ""))
                )
        elif tag == "select":
            self._select = attrs["name"]
        elif tag == "option" and self._select and "selected" in attrs:
            self.fields.append((self._select, attrs.get("value", "")))
        elif tag == "textarea":
            self._textarea = attrs["name"]
            self.fields.append((self._textarea, ""))

    def handle_data(self, data):
        if self._textarea is not None:
            name, text = self.fields[-1]
            self.fields[-1] = (name, text + data)

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None
        elif tag == "form" and self._in_form:
            self._in_form, self._done = False, True


def form_data(html: str, form_id: str, **changes: str | None) -> dict[str, list[str]]:
    """The page's form as a browser would post it, with `changes` (None: unchecked/removed)."""
    parser = FormFields(form_id)
    parser.feed(html)
    data: dict[str, list[str]] = {}
    for name, value in parser.fields:
        data.setdefault(name, []).append(value.strip("\n") if value else value)
    for name, value in changes.items():
        if value is None:
            data.pop(name, None)
        else:
            data[name] = [value]
    return data
