"""Item 13: a websocket lives only as long as the login session that opened it. Logout, a
password change (on any path) and an admin deactivating the user close that user's sockets whose
session no longer stands; every frame re-checks the session, so nothing from a dead session is
stored or answered."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from django.contrib.sessions.models import Session
from django.test import Client
from django.urls import reverse

from apps.accounts.models import User
from apps.accounts.services import user_create
from apps.accounts.sessions import SessionCheck
from apps.chat.models import Message
from apps.chat.services import conversation_create, message_create
from tests.security.conftest import (
    NEW_PASSWORD,
    closed_with,
    end_without_event,
    form_data,
    logged_in,
    websocket,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_thread_connections"),
]

PASSWORD = "correct-horse-battery"


@pytest.fixture
async def chat_path(user):
    conversation = await sync_to_async(conversation_create)(owner=user)
    return f"/ws/chat/{conversation.id}/"


@pytest.fixture
async def staff():
    return await sync_to_async(user_create)(username="root", password=PASSWORD, is_staff=True)


async def still_answers(ws) -> bool:
    """The socket is open and its session stands: a frame gets its reply."""
    await ws.send_to(text_data=json.dumps({"type": "explode"}))
    frame = json.loads(await ws.receive_from(timeout=10))
    return frame["type"] == "error" and "Unknown action" in frame["message"]


async def test_logout_closes_that_sessions_socket_and_only_that_one(user, chat_path):
    client, key = await sync_to_async(logged_in)(user)
    _, other_key = await sync_to_async(logged_in)(user)  # the same user in another browser
    async with websocket(chat_path, session_key=key) as (ws, ok, _):
        async with websocket(chat_path, session_key=other_key) as (other_ws, other_ok, _):
            assert ok and other_ok
            await sync_to_async(client.post)(reverse("accounts:logout"))
            assert await closed_with(ws) == 4401
            assert await still_answers(other_ws)


async def test_a_frame_sent_after_logout_is_neither_stored_nor_answered(user, chat_path):
    client, key = await sync_to_async(logged_in)(user)
    async with websocket(chat_path, session_key=key) as (ws, ok, _):
        assert ok
        await sync_to_async(client.post)(reverse("accounts:logout"))
        await ws.send_to(text_data=json.dumps({"type": "send", "text": "after logout"}))
        # Whichever comes first, the logout event or the frame: the socket closes, and says
        # nothing else before it does.
        message = await ws.receive_output(timeout=10)
        assert message == {"type": "websocket.close", "code": 4401}
    assert not await sync_to_async(Message.objects.exists)()


async def test_every_frame_rechecks_the_session_even_when_no_event_came(user, chat_path):
    """The session ends without any event (deleted from the store, as `clearsessions` or an
    operator would): the next frame still finds out before acting on it."""
    _, key = await sync_to_async(logged_in)(user)
    async with websocket(chat_path, session_key=key) as (ws, ok, _):
        assert ok
        await sync_to_async(Session.objects.filter(session_key=key).delete)()
        await ws.send_to(text_data=json.dumps({"type": "send", "text": "from a dead session"}))
        assert await ws.receive_output(timeout=10) == {"type": "websocket.close", "code": 4401}
    assert not await sync_to_async(Message.objects.exists)()


@pytest.mark.parametrize("how", ["session expired", "password changed", "user deactivated"])
async def test_a_question_is_not_stored_once_the_session_ended_silently(user, chat_path, how):
    """A question's session check rides in its insert (the socket checked the session in full
    when it opened): every way a session ends with no event to tell the socket still stops
    the question there."""
    _, key = await sync_to_async(logged_in)(user)
    async with websocket(chat_path, session_key=key) as (ws, ok, _):
        assert ok
        await sync_to_async(end_without_event)(how, user_id=user.pk, session_key=key)
        await ws.send_to(text_data=json.dumps({"type": "send", "text": "after it ended"}))
        assert await ws.receive_output(timeout=10) == {"type": "websocket.close", "code": 4401}
    assert not await sync_to_async(Message.objects.exists)()


@pytest.mark.parametrize(
    "how", ["session deleted", "session expired", "password changed", "user deactivated", None]
)
def test_the_insert_condition_agrees_with_the_full_check(user, how):
    """SessionCheck.condition, checked by the insert, says what SessionCheck.current says."""
    _, key = logged_in(user)
    conversation = conversation_create(owner=user)
    check = SessionCheck(session_key=key, user_id=user.pk)
    assert check.condition() is None  # nothing to compare with before a full check
    assert check.current()
    condition = check.condition()
    if how is not None:
        end_without_event(how, user_id=user.pk, session_key=key)
    stored = message_create(
        conversation=conversation, role=Message.Role.USER, text="hello", only_if=condition
    )
    assert (stored is not None) is (how is None)
    assert check.current() is (how is None)
    if how is not None:
        assert check.condition() is None  # a failed check leaves nothing to compare with


async def test_a_password_changed_on_the_site_closes_the_users_other_sessions(user, chat_path):
    _, key = await sync_to_async(logged_in)(user)
    changer, _ = await sync_to_async(logged_in)(user)
    async with websocket(chat_path, session_key=key) as (ws, ok, _):
        assert ok
        response = await sync_to_async(changer.post)(
            reverse("accounts:password_change"),
            {
                "oldpassword": PASSWORD,
                "password1": NEW_PASSWORD,
                "password2": NEW_PASSWORD,
            },
        )
        assert response.status_code == 302
        assert await closed_with(ws) == 4401
    # The session that changed it stays logged in.
    assert (await sync_to_async(changer.get)(reverse("accounts:profile"))).status_code == 200


def set_password(user_id: int) -> None:
    """A password changed from a shell: `set_password` and `save`."""
    fresh = User.objects.get(pk=user_id)
    fresh.set_password(NEW_PASSWORD)
    fresh.save()


async def test_set_password_and_save_closes_the_users_sockets_and_no_one_elses(
    user, other_user, chat_path
):
    _, key = await sync_to_async(logged_in)(user)
    theirs = Client()
    await sync_to_async(theirs.force_login)(other_user)
    async with websocket(chat_path, session_key=key) as (ws, ok, _):
        assert ok
        # Another user logging out and changing their password leaves this socket alone.
        await sync_to_async(theirs.post)(reverse("accounts:logout"))
        await sync_to_async(set_password)(other_user.pk)
        assert await still_answers(ws)

        await sync_to_async(set_password)(user.pk)
        assert await closed_with(ws) == 4401


async def test_a_password_set_by_an_admin_closes_the_users_sockets(user, staff, chat_path):
    _, key = await sync_to_async(logged_in)(user)
    admin, _ = await sync_to_async(logged_in)(staff)
    url = reverse("admin:auth_user_password_change", args=[user.pk])
    async with websocket(chat_path, session_key=key) as (ws, ok, _):
        assert ok
        response = await sync_to_async(admin.post)(
            url,
            {
                "password1": NEW_PASSWORD,
                "password2": NEW_PASSWORD,
                "usable_password": "true",
            },
        )
        assert response.status_code == 302, response.content[:2000]
        assert await closed_with(ws) == 4401


async def test_an_admin_deactivating_the_user_closes_their_sockets(user, staff, chat_path):
    _, key = await sync_to_async(logged_in)(user)
    admin, _ = await sync_to_async(logged_in)(staff)
    url = reverse("admin:accounts_user_change", args=[user.pk])
    async with websocket(chat_path, session_key=key) as (ws, ok, _):
        assert ok
        page = await sync_to_async(admin.get)(url)
        data = form_data(page.content.decode(), "user_form", is_active=None, _save="Save")
        response = await sync_to_async(admin.post)(url, data)
        assert response.status_code == 302, response.content[:2000]
        assert not (await sync_to_async(User.objects.get)(pk=user.pk)).is_active
        assert await closed_with(ws) == 4401
