from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from apps.accounts.models import ApiKey, Tag, User
from apps.accounts.services import api_key_authenticate, api_key_create, api_key_revoke

pytestmark = pytest.mark.django_db


def test_signup_creates_a_user_with_a_profile_and_logs_in():
    client = Client()
    response = client.post(
        reverse("accounts:signup"),
        {
            "username": "newbie",
            "password1": "a-long-passphrase-9",
            "password2": "a-long-passphrase-9",
        },
    )
    assert response.status_code == 302
    user = User.objects.get(username="newbie")
    assert user.profile.display_name == "newbie"
    assert client.get(reverse("accounts:profile")).status_code == 200


def test_signup_rejects_mismatched_passwords_without_creating_anyone():
    response = Client().post(
        reverse("accounts:signup"),
        {"username": "newbie", "password1": "a-long-passphrase-9", "password2": "different-9"},
    )
    assert response.status_code == 200
    assert b"You must type the same password each time." in response.content
    assert not User.objects.filter(username="newbie").exists()


def test_login_and_logout(user):
    client = Client()
    response = client.post(
        reverse("accounts:login"), {"username": "alice", "password": "correct-horse-battery"}
    )
    assert response.status_code == 302
    assert client.get(reverse("chat:index")).status_code == 200
    client.post(reverse("accounts:logout"))
    assert client.get(reverse("chat:index")).status_code == 302


def _fail_login(client: Client, username: str):
    return client.post(reverse("accounts:login"), {"username": username, "password": "wrong-pass"})


@pytest.mark.parametrize("username", ["alice", "nobody-by-this-name"])
def test_repeated_failed_logins_are_throttled_alike_for_real_and_unknown_accounts(user, username):
    client = Client()
    for _ in range(5):
        assert _fail_login(client, username).status_code == 200
    throttled = _fail_login(client, username)
    assert throttled.status_code == 429
    assert b"Too many failed attempts" in throttled.content
    # Even the right password waits out the window.
    if username == "alice":
        right = client.post(
            reverse("accounts:login"), {"username": "alice", "password": "correct-horse-battery"}
        )
        assert right.status_code == 429


def test_throttle_is_per_account_so_others_can_still_log_in(user, other_user):
    client = Client()
    for _ in range(6):
        _fail_login(client, "alice")
    response = client.post(
        reverse("accounts:login"), {"username": "mallory", "password": "correct-horse-battery"}
    )
    assert response.status_code == 302


def test_failed_login_message_does_not_reveal_whether_the_account_exists(user):
    csrf = r'(csrfmiddlewaretoken" value="|X-CSRFToken": ")[^"]+'
    real = _fail_login(Client(), "alice").content.decode()
    unknown = _fail_login(Client(), "ghost").content.decode()
    assert "Please enter a correct username and password" in real
    assert re.sub(csrf, "", real.replace("alice", "X")) == re.sub(
        csrf, "", unknown.replace("ghost", "X")
    )


def test_profile_update_with_tags(user, client_for):
    tag = Tag.objects.create(name="Teacher", slug="teacher", prompt_hint="Teaches.")
    inactive = Tag.objects.create(name="Old", slug="old", is_active=False)
    response = client_for(user).post(
        reverse("accounts:profile"),
        {
            "display_name": "Alice A.",
            "language": "French",
            "expertise": "expert",
            "about": "I teach physics.",
            "tags": [tag.id, inactive.id],
        },
    )
    assert response.status_code == 200  # inactive tag is not a valid choice
    assert b"not one of the available choices" in response.content
    response = client_for(user).post(
        reverse("accounts:profile"),
        {
            "display_name": "Alice A.",
            "language": "French",
            "expertise": "expert",
            "about": "I teach physics.",
            "tags": [tag.id],
        },
    )
    assert response.status_code == 302
    user.profile.refresh_from_db()
    assert user.profile.language == "French"
    assert list(user.profile.tags.all()) == [tag]


def test_profile_requires_login():
    response = Client().get(reverse("accounts:profile"))
    assert response.status_code == 302
    assert reverse("accounts:login") in response["Location"]


def test_an_api_key_names_its_active_user_until_revoked_and_records_its_use_sparingly(user):
    key, raw = api_key_create(user=user, name="script")
    assert api_key_authenticate(raw=raw) == user
    used = ApiKey.objects.get(pk=key.pk).last_used
    assert used is not None
    assert api_key_authenticate(raw=raw) == user
    # A burst of requests is not a write each: the time moves on at most once a minute.
    assert ApiKey.objects.get(pk=key.pk).last_used == used
    assert api_key_authenticate(raw=raw + "x") is None
    user.is_active = False
    user.save()
    assert api_key_authenticate(raw=raw) is None
    user.is_active = True
    user.save()
    api_key_revoke(user=user, key_id=key.pk)
    assert api_key_authenticate(raw=raw) is None
