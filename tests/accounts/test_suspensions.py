"""Suspending a person from the admin: their open socket closes at once, their API keys stop,
sign-in tells them why and until when (and tells nobody else anything), and the suspension ends
by itself when its time is up."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from apps.accounts.models import Suspension, User
from apps.accounts.services import (
    api_key_authenticate,
    api_key_create,
    user_create,
    user_suspend,
)
from apps.chat.services import conversation_create
from tests.security.conftest import (  # noqa: F401  (close_thread_connections: a fixture)
    close_thread_connections,
    closed_with,
    logged_in,
    websocket,
)

PASSWORD = "correct-horse-battery"
REASON = "Repeated attempts to make the assistant write malware"


def sign_in(username: str, password: str = PASSWORD):
    client = Client()
    response = client.post(reverse("accounts:login"), {"username": username, "password": password})
    return client, response


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_thread_connections")
async def test_suspending_in_the_admin_closes_the_persons_socket_and_stops_their_keys(user):
    conversation = await sync_to_async(conversation_create)(owner=user)
    _, raw_key = await sync_to_async(api_key_create)(user=user, name="script")
    _, session_key = await sync_to_async(logged_in)(user)
    root = await sync_to_async(user_create)(username="root", password=PASSWORD, is_staff=True)
    admin, _ = await sync_to_async(logged_in)(root)
    until = (timezone.localtime() + timedelta(days=3)).replace(microsecond=0)
    async with websocket(f"/ws/chat/{conversation.id}/", session_key=session_key) as (
        ws,
        accepted,
        _,
    ):
        assert accepted
        response = await sync_to_async(admin.post)(
            reverse("admin:accounts_suspension_add"),
            {
                "user": str(user.pk),
                "reason": REASON,
                "until_0": until.strftime("%Y-%m-%d"),
                "until_1": until.strftime("%H:%M:%S"),
            },
        )
        assert response.status_code == 302, response.content[:2000]
        assert await closed_with(ws) == 4401
    suspension = await sync_to_async(Suspension.objects.select_related("by").get)()
    assert (suspension.reason, suspension.by.username) == (REASON, "root")
    assert not (await sync_to_async(User.objects.get)(pk=user.pk)).is_active
    assert await sync_to_async(api_key_authenticate)(raw=raw_key) is None


@pytest.mark.django_db
def test_sign_in_says_why_only_to_the_person_with_the_password(user):
    user_suspend(user=user, reason=REASON, until=None, by=None)
    client, told = sign_in("alice")
    page = told.content.decode()
    assert "Your account is suspended until a member of staff lifts it" in page
    assert REASON in page
    assert "_auth_user_id" not in client.session

    _, wrong = sign_in("alice", "not-the-password")
    _, unknown = sign_in("nobody-here", "not-the-password")
    assert REASON not in wrong.content.decode()
    assert "suspended" not in wrong.content.decode()
    assert wrong.status_code == unknown.status_code == 200
    assert wrong.context["form"].errors == unknown.context["form"].errors


@pytest.mark.django_db
def test_a_suspension_ends_by_itself_when_its_time_is_up(user, other_user):
    user_suspend(user=user, reason=REASON, until=timezone.now() + timedelta(hours=1), by=None)
    _, told = sign_in("alice")
    assert "Your account is suspended until" in told.content.decode()
    Suspension.objects.update(until=timezone.now() - timedelta(seconds=1))
    client, response = sign_in("alice")
    assert response.status_code == 302
    assert client.get(reverse("accounts:profile")).status_code == 200
    assert Suspension.objects.get().lifted is not None

    # For someone who does not sign in, the periodic command lifts it (their API keys work).
    _, raw_key = api_key_create(user=other_user, name="script")
    user_suspend(user=other_user, reason=REASON, until=timezone.now() + timedelta(hours=1), by=None)
    assert api_key_authenticate(raw=raw_key) is None
    Suspension.objects.filter(lifted__isnull=True).update(until=timezone.now())
    call_command("lift_suspensions")
    assert api_key_authenticate(raw=raw_key).pk == other_user.pk


@pytest.mark.django_db
def test_staff_lift_a_suspension_and_cannot_rewrite_or_delete_one(user):
    root = user_create(username="root", password=PASSWORD, is_staff=True)
    admin = Client()
    admin.force_login(root)
    suspension = user_suspend(user=user, reason=REASON, until=None, by=root)
    change = reverse("admin:accounts_suspension_change", args=[suspension.pk])
    admin.post(change, {"reason": "rewritten"})
    assert (
        admin.post(
            reverse("admin:accounts_suspension_delete", args=[suspension.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    assert Suspension.objects.get().reason == REASON
    admin.post(
        reverse("admin:accounts_suspension_changelist"),
        {"action": "lift_selected", "_selected_action": [suspension.pk]},
    )
    assert Suspension.objects.get().lifted is not None
    assert User.objects.get(pk=user.pk).is_active
    past = timezone.now() - timedelta(hours=1)
    refused = admin.post(
        reverse("admin:accounts_suspension_add"),
        {
            "user": str(user.pk),
            "reason": REASON,
            "until_0": past.strftime("%Y-%m-%d"),
            "until_1": past.strftime("%H:%M:%S"),
        },
    )
    assert refused.status_code == 200 and "A time still to come" in refused.content.decode()
    assert User.objects.get(pk=user.pk).is_active
