"""Mail without a mail server: with no EMAIL_URL, every mail Sluice sends is printed on the
console and kept for the dev mailbox page, so `make run` can sign people up and reset passwords
on a machine with nothing else installed. Staff can read the page; anyone can while DEBUG is on
(a developer's own machine)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.core.mail.backends.console import EmailBackend as ConsoleBackend
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from apps.accounts.models import MailboxMessage


class DevMailboxBackend(ConsoleBackend):
    def send_messages(self, email_messages) -> int:
        sent = super().send_messages(email_messages) or 0
        rows = [
            MailboxMessage(
                to=", ".join(message.to),
                subject=str(message.subject)[:300],
                body=str(message.body),
            )
            for message in email_messages
        ]
        MailboxMessage.objects.bulk_create(rows)
        stale = MailboxMessage.objects.order_by("-sent", "-id")[settings.DEV_MAILBOX_KEEP :]
        MailboxMessage.objects.filter(id__in=stale.values("id")).delete()
        return sent


def _open_to_staff(view):
    """Anyone while DEBUG is on; otherwise signed-in staff (others: sign in, or 403)."""

    def wrapped(request, *args, **kwargs):
        if settings.DEBUG:
            return view(request, *args, **kwargs)
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not (request.user.is_active and request.user.is_staff):
            raise PermissionDenied("The dev mailbox is for staff.")
        return view(request, *args, **kwargs)

    return wrapped


@require_GET
@_open_to_staff
def mailbox(request: HttpRequest) -> HttpResponse:
    """The newest mails, newest first; links in them are clickable (urlize escapes the rest)."""
    configured = settings.EMAIL_BACKEND == "apps.accounts.mailbox.DevMailboxBackend"
    messages = MailboxMessage.objects.all()[: settings.DEV_MAILBOX_KEEP]
    return render(request, "accounts/mailbox.html", {"mails": messages, "configured": configured})
