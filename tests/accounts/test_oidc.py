"""Signing in through an OpenID Connect provider: the real protocol against a real provider
(django-oauth-toolkit, a second process on loopback), discovery, PKCE, signed ID tokens and
all. An existing account is reached only through an address both sides verified."""

from __future__ import annotations

import pytest
from allauth.account.models import EmailAddress
from allauth.socialaccount.models import SocialAccount
from django.test import Client

from apps.accounts.models import User
from apps.accounts.services import user_create
from tests.accounts.oidc import (
    PROVIDER_ID,
    callback_path,
    oidc_provider,
    provider_settings,
    sign_in_at_provider,
)

pytestmark = pytest.mark.django_db

PASSWORD = "provider-passphrase-1"
PEOPLE = [
    {"username": "ines", "password": PASSWORD, "email": "ines@example.org"},
    {"username": "olu", "password": PASSWORD, "email": "olu@example.org"},
    {"username": "pat", "password": PASSWORD, "email": "pat@example.org"},
    {"username": "quin", "password": PASSWORD, "email": "quin@example.org", "verified": False},
]


@pytest.fixture(scope="module")
def issuer(tmp_path_factory):
    redirect_uri = "http://testserver" + callback_path()
    with oidc_provider(
        tmp_path_factory.mktemp("idp"), redirect_uri=redirect_uri, users=PEOPLE
    ) as url:
        yield url


@pytest.fixture
def provider(issuer, settings):
    settings.SOCIALACCOUNT_PROVIDERS = provider_settings(issuer)
    return issuer


def sign_in(client: Client, username: str):
    """The whole round trip: Sluice's button, the provider's login, the callback."""
    start = client.post(f"/accounts/oidc/{PROVIDER_ID}/login/")
    assert start.status_code == 302, start.content[:300]
    assert start["Location"].startswith("http://127.0.0.1:")  # off to the provider
    assert "code_challenge=" in start["Location"]  # PKCE
    back = sign_in_at_provider(start["Location"], username=username, password=PASSWORD)
    assert back.startswith("http://testserver" + callback_path())
    return client.get(back.removeprefix("http://testserver"))


def local_account(username: str, email: str, *, verified: bool) -> User:
    user = user_create(username=username, password="local-passphrase-9", email=email)
    EmailAddress.objects.create(user=user, email=email, verified=verified, primary=True)
    return user


def signed_in_as(client: Client) -> User | None:
    user_id = client.session.get("_auth_user_id")
    return User.objects.get(pk=user_id) if user_id else None


def test_a_new_person_gets_an_account_with_the_verified_address(provider):
    client = Client()
    response = sign_in(client, "ines")
    assert response.status_code == 302
    user = signed_in_as(client)
    assert user is not None and user.email == "ines@example.org"
    assert EmailAddress.objects.get(user=user).verified
    assert not user.has_usable_password()  # their password lives with the provider
    assert user.profile is not None
    assert SocialAccount.objects.get(user=user).provider == PROVIDER_ID
    assert client.get("/").status_code == 200


def test_an_account_whose_address_is_verified_here_too_is_linked(provider):
    olu = local_account("olu-local", "olu@example.org", verified=True)
    client = Client()
    sign_in(client, "olu")
    assert signed_in_as(client) == olu
    assert SocialAccount.objects.get().user == olu
    assert User.objects.count() == 1
    olu.refresh_from_db()
    assert olu.check_password("local-passphrase-9")  # nothing of theirs was wiped


def test_an_account_whose_address_was_never_verified_here_is_not_handed_over(provider):
    """Someone signed up with pat's address (never verified): pat's sign-in through the
    provider must not land in that account."""
    squatter = local_account("squatter", "pat@example.org", verified=False)
    client = Client()
    sign_in(client, "pat")
    assert signed_in_as(client) != squatter
    assert not SocialAccount.objects.filter(user=squatter).exists()
    squatter.refresh_from_db()
    assert squatter.check_password("local-passphrase-9")


def test_an_address_the_provider_did_not_verify_links_nothing(provider):
    quin = local_account("quin-local", "quin@example.org", verified=True)
    client = Client()
    sign_in(client, "quin")
    assert signed_in_as(client) != quin
    assert not SocialAccount.objects.filter(user=quin).exists()


def test_with_the_local_password_off_only_the_provider_signs_in(provider, settings, user):
    settings.SLUICE_LOCAL_PASSWORD = False
    client = Client()
    page = client.get("/accounts/login/").content.decode()
    assert 'name="password"' not in page and "Test IdP" in page
    refused = client.post(
        "/accounts/login/", {"username": "alice", "password": "correct-horse-battery"}
    )
    assert refused.status_code == 403 and signed_in_as(client) is None
    assert client.get("/accounts/password/reset/").status_code == 404
    signup = client.post(
        "/accounts/signup/",
        {
            "username": "newbie",
            "password1": "a-long-passphrase-9",
            "password2": "a-long-passphrase-9",
        },
    )
    assert not User.objects.filter(username="newbie").exists(), signup.status_code
    sign_in(client, "ines")
    assert signed_in_as(client).email == "ines@example.org"
