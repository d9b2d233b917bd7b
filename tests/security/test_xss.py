"""What people and staff type comes back as text on every page of accounts, reports and the
operations views, never as markup.

Generated from the URL conf as the IDOR sweep is: every route under the prefixes below, with
its id-like parameters filled with the ids of objects whose every text field holds markup, is
requested by their owner and by a superuser who gave a reason to read them. A route added under
these prefixes later is swept without anyone adding it here."""

from __future__ import annotations

import time

import pytest
from allauth.account.models import EmailAddress
from allauth.socialaccount.models import SocialApp
from django.test import Client
from django.urls import get_resolver, resolve

from apps.accounts import read_gate
from apps.accounts.models import MailboxMessage, Suspension
from apps.accounts.services import staff_read_record, user_create
from apps.chat.services import conversation_create, message_create
from apps.ops.models import Report
from apps.usage.models import HourlyUsage
from tests.security.test_idor import PARAMETER, filled, id_like, routes

pytestmark = pytest.mark.django_db(transaction=True)

MARKUP = "<script>alert(1)</script><img src=x onerror=alert(2)>"
PREFIXES = ("accounts/", "report/", "admin/ops/", "admin/accounts/", "admin/socialaccount/")


def swept(prefixes=PREFIXES) -> list[str]:
    found = []
    for route, _ in routes(get_resolver().url_patterns):
        if not route.startswith(prefixes) or "(?P<" in route:
            continue
        names = [m["name"] for m in PARAMETER.finditer(route)]
        if all(id_like(name) for name in names):
            found.append(route)
    return found


@pytest.fixture
def marked(settings):
    """A person whose every field Sluice shows holds markup, and a superuser."""
    settings.EMAIL_BACKEND = "apps.accounts.mailbox.DevMailboxBackend"
    owner = user_create(username="owner", password="correct-horse-battery")
    owner.first_name = owner.last_name = MARKUP
    owner.save()
    EmailAddress.objects.create(user=owner, email="owner@example.org", verified=True)
    conversation = conversation_create(owner=owner, title=MARKUP[:100])
    message_create(conversation=conversation, role="user", text=MARKUP)
    answer = message_create(conversation=conversation, role="assistant", text=MARKUP)
    report = Report.objects.create(
        reporter=owner,
        conversation_id=conversation.id,
        message_id=answer.id,
        reported_text=MARKUP,
        context=MARKUP,
        details=MARKUP,
        model=MARKUP,
        category="other",
    )
    admin = user_create(username="root", password="correct-horse-battery", is_staff=True)
    suspension = Suspension.objects.create(user=owner, reason=MARKUP, by=admin)
    staff_read_record(
        reader=admin, owners=[(owner, "1")], subject="conversation", reason=MARKUP, address=""
    )
    MailboxMessage.objects.create(to=MARKUP, subject=MARKUP, body=MARKUP)
    SocialApp.objects.create(
        provider="openid_connect",
        provider_id="markup",
        name=MARKUP[:25],
        client_id="x",
        settings={"server_url": "http://127.0.0.1:9/"},
    )
    HourlyUsage.objects.create(
        hour=answer.created.replace(minute=0, second=0, microsecond=0),
        user=owner,
        kind="chat",
        outcome="rejected",
        reason="rate_limited",
        requests=3,
        model=MARKUP[:200],
    )
    ids = [answer.id, report.id, suspension.id, conversation.id, owner.id, owner.profile.id]
    return owner, admin, [str(i) for i in ids], (conversation.id, report.id)


def reading_superuser(admin, conversation_id: int, report_id: int) -> Client:
    """A superuser who gave a reason for the conversation and the report already."""
    client = Client()
    client.force_login(admin)
    session = client.session
    until = time.time() + 600
    session[read_gate.SESSION_KEY] = {
        f"conversation:{conversation_id}": until,
        f"report:{report_id}": until,
    }
    session.save()
    return client


def test_the_sweep_covers_the_new_pages():
    covered = swept()
    for route in (
        "accounts/login/",
        "accounts/signup/",
        "accounts/dev/mailbox/",
        "accounts/privacy/",
        "accounts/email/",
        "accounts/2fa/",
        "report/answer/<int:message_id>/",
        "admin/ops/refused/",
        "admin/ops/report/",
        "admin/ops/report/<path:object_id>/change/",
        "admin/accounts/suspension/<path:object_id>/change/",
    ):
        assert route in covered, route


def test_no_new_page_shows_markup_it_was_given(marked, settings):
    owner, admin, ids, (conversation_id, report_id) = marked
    admin.is_superuser = True
    admin.save()
    owner_client = Client()
    owner_client.force_login(owner)
    clients = {
        "owner": owner_client,
        "superuser": reading_superuser(admin, conversation_id, report_id),
        "anonymous": Client(),
    }
    settings.DEBUG = False
    shown, leaked = 0, []
    for route in swept():
        urls = [filled(route, value) for value in ids] if "<" in route else ["/" + route]
        for url in urls:
            try:
                resolve(url)
            except Exception:
                continue
            for who, client in clients.items():
                response = client.get(url)
                # Only pages: a CSV holds what was typed as it was typed, for a spreadsheet.
                html = response.get("Content-Type", "").startswith("text/html")
                if response.status_code != 200 or not html:
                    continue
                body = (
                    b"".join(response.streaming_content) if response.streaming else response.content
                ).decode(errors="replace")
                shown += "&lt;script&gt;" in body
                if "<script>alert(1)" in body or "<img src=x" in body:
                    leaked.append(f"{who} GET {url}")
    assert not leaked, "markup rendered as markup:\n" + "\n".join(leaked)
    assert shown >= 8  # the fields were on the pages, as text
