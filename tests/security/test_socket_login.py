"""A websocket's login (apps/accounts/socket_login.py) logs in exactly whom Channels' own lookup
would, refuses every session that no longer stands, and leaves the socket's session check
passed, so that the first question's insert carries it."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.auth import get_user
from django.contrib.auth import BACKEND_SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session

from apps.accounts.sessions import account_event_publish
from apps.accounts.socket_login import socket_login
from apps.chat.models import Message
from apps.chat.services import conversation_create, message_create
from core.account_events import events_last_id
from tests.security.conftest import end_without_event, logged_in, websocket

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_thread_connections"),
]

ENDINGS = ["session deleted", "session expired", "password changed", "user deactivated"]


def channels_user(session_key: str | None):
    return get_user.func({"session": SessionStore(session_key=session_key)})


def test_a_standing_session_logs_its_user_in_with_the_check_passed(user):
    _, key = logged_in(user)
    login = socket_login(key)
    assert login.user.pk == user.pk and login.user.is_authenticated
    assert login.user.username == user.username  # the whole row, not only the id
    assert login.user.pk == channels_user(key).pk
    condition = login.session.condition()  # ready without a check of its own
    assert condition is not None
    conversation = conversation_create(owner=user)
    stored = message_create(
        conversation=conversation, role=Message.Role.USER, text="hi", only_if=condition
    )
    assert stored is not None


@pytest.mark.parametrize("how", ENDINGS)
def test_a_session_that_no_longer_stands_logs_no_one_in(user, how):
    _, key = logged_in(user)
    end_without_event(how, user_id=user.pk, session_key=key)
    login = socket_login(key)
    assert not login.user.is_authenticated
    assert not channels_user(key).is_authenticated
    assert login.session.condition() is None


@pytest.mark.parametrize("key", [None, "", "no-such-session", "x" * 500, "'; DROP TABLE --"])
def test_a_missing_or_made_up_cookie_logs_no_one_in(user, key):
    login = socket_login(key)
    assert not login.user.is_authenticated
    assert not channels_user(key).is_authenticated


def test_tampered_session_data_logs_no_one_in(user):
    _, key = logged_in(user)
    session = Session.objects.get(session_key=key)
    payload, _, signature = session.session_data.rpartition(":")
    Session.objects.filter(session_key=key).update(session_data=f"{payload}:{signature[::-1]}")
    assert not socket_login(key).user.is_authenticated


def test_a_backend_no_longer_configured_logs_no_one_in(user, settings):
    _, key = logged_in(user)
    settings.AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.RemoteUserBackend"]
    assert not socket_login(key).user.is_authenticated
    assert not channels_user(key).is_authenticated


def test_other_backends_and_session_stores_go_the_general_way(user, settings):
    """A login by another configured backend is looked up by that backend, as Channels does."""
    backend = "django.contrib.auth.backends.AllowAllUsersModelBackend"
    settings.AUTHENTICATION_BACKENDS = [backend]
    _, key = logged_in(user)
    assert SessionStore(session_key=key).load()[BACKEND_SESSION_KEY] == backend
    login = socket_login(key)
    assert login.user.pk == user.pk
    assert login.session.condition() is not None
    end_without_event("user deactivated", user_id=user.pk, session_key=key)
    assert not socket_login(key).user.is_authenticated  # the socket's own check still holds

    settings.SESSION_ENGINE = "django.contrib.sessions.backends.cache"
    settings.AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"]
    user.is_active = True
    user.save()
    _, cached_key = logged_in(user)
    assert socket_login(cached_key).user.pk == user.pk
    assert not socket_login(key).user.is_authenticated  # a database session: not this store


def test_the_login_follows_account_events_from_before_its_session_read(user):
    """An event published once the login has read the session comes after `events_after`,
    so the socket hears of it."""
    account_event_publish(user_id=user.pk, kind="logout")
    before = events_last_id()
    _, key = logged_in(user)
    login = socket_login(key)
    assert login.events_after == before
    account_event_publish(user_id=user.pk, kind="logout")
    assert events_last_id() > login.events_after


@pytest.mark.parametrize("path", ["chat", "/ws/inbox/"])
async def test_sockets_of_ended_sessions_do_not_open(user, path):
    conversation = await sync_to_async(conversation_create)(owner=user)
    path = f"/ws/chat/{conversation.id}/" if path == "chat" else path
    _, key = await sync_to_async(logged_in)(user)
    async with websocket(path, session_key=key) as (_, ok, _code):
        assert ok
    await sync_to_async(end_without_event)("password changed", user_id=user.pk, session_key=key)
    async with websocket(path, session_key=key) as (_, ok, code):
        assert (ok, code) == (False, 4401)
