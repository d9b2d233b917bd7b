"""Mail without a mail server (the dev mailbox `make run` uses), and changing the address:
the new one counts only once its link is followed."""

from __future__ import annotations

import pytest
from allauth.account.models import EmailAddress
from django.core import mail
from django.test import Client

from apps.accounts.mailbox import DevMailboxBackend
from apps.accounts.models import MailboxMessage
from apps.accounts.services import user_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def dev_mailbox(settings):
    settings.EMAIL_BACKEND = "apps.accounts.mailbox.DevMailboxBackend"


def test_with_no_mail_server_a_reset_mail_lands_on_the_console_and_the_mailbox(
    dev_mailbox, capsys, user, settings
):
    user.email = "alice@example.org"
    user.save()
    EmailAddress.objects.create(user=user, email=user.email, verified=True, primary=True)
    Client().post("/accounts/password/reset/", {"email": "alice@example.org"})
    assert "/accounts/password/reset/key/" in capsys.readouterr().out
    kept = MailboxMessage.objects.get()
    assert kept.to == "alice@example.org" and "/accounts/password/reset/key/" in kept.body

    staff = user_create(username="root", password="correct-horse-battery", is_staff=True)
    staff_client = Client()
    staff_client.force_login(staff)
    page = staff_client.get("/accounts/dev/mailbox/").content.decode()
    assert 'href="http://testserver/accounts/password/reset/key/' in page
    person = Client()
    person.force_login(user_create(username="pat", password="correct-horse-battery"))
    assert person.get("/accounts/dev/mailbox/").status_code == 403
    assert Client().get("/accounts/dev/mailbox/").status_code == 302  # sign in first
    settings.DEBUG = True  # a developer's own machine
    assert Client().get("/accounts/dev/mailbox/").status_code == 200


def test_the_mailbox_keeps_only_the_newest(dev_mailbox, settings):
    settings.DEV_MAILBOX_KEEP = 3
    for n in range(5):
        mail.EmailMessage(f"mail {n}", "body", to=["x@example.org"]).send()
    assert list(MailboxMessage.objects.values_list("subject", flat=True)) == [
        "mail 4",
        "mail 3",
        "mail 2",
    ]
    assert DevMailboxBackend().send_messages([]) == 0


def test_a_mail_body_is_shown_as_text(dev_mailbox, settings):
    settings.DEBUG = True
    mail.EmailMessage(
        "<b>hi</b>", "<script>alert(1)</script> http://x.example/", to=["a@b.c"]
    ).send()
    page = Client().get("/accounts/dev/mailbox/").content.decode()
    assert "<script>alert(1)" not in page and "&lt;script&gt;" in page
    assert "<b>hi</b>" not in page


def test_a_new_address_counts_only_once_verified(user, client_for):
    user.email = "alice@example.org"
    user.save()
    EmailAddress.objects.create(user=user, email=user.email, verified=True, primary=True)
    client = client_for(user)
    client.post("/accounts/email/", {"action_add": "", "email": "alice@new.example.org"})
    user.refresh_from_db()
    assert user.email == "alice@example.org"  # still the old one
    sent = mail.outbox[-1]
    assert sent.to == ["alice@new.example.org"]
    link = next(w for w in sent.body.split() if "/accounts/confirm-email/" in w)
    client.post(link.removeprefix("http://testserver"))
    user.refresh_from_db()
    assert user.email == "alice@new.example.org"
    assert list(EmailAddress.objects.filter(user=user).values_list("email", "verified")) == [
        ("alice@new.example.org", True)
    ]
