"""Account changes that end sessions tell the user's open sockets and event streams
(apps/accounts/sessions.py, apps/api/stream_session.py).

Model signals, not the views that make the changes: a password changes through the site's form,
the admin's, a shell's `set_password` and `save`, and each must reach the sockets alike.
`QuerySet.update()` sends no signal; the sockets' per-frame checks still catch what it changes.
"""

from __future__ import annotations

from allauth.account.signals import user_signed_up
from django.conf import settings
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import post_delete, post_init, post_save
from django.dispatch import receiver

from apps.accounts.models import ApiKey
from apps.accounts.services import profile_get_or_create
from apps.accounts.sessions import AccountEvent, account_event_publish


@receiver(user_signed_up, dispatch_uid="sluice-profile-at-sign-up")
def profile_created(sender, request, user, **kwargs) -> None:
    """Every account has a profile from the start, however it signed up (a form, a provider)."""
    profile_get_or_create(user=user)


def _credentials(user) -> tuple:
    # From __dict__: reading a deferred field here would cost a query per instance.
    return user.__dict__.get("password"), user.__dict__.get("is_active")


@receiver(user_logged_out, dispatch_uid="sluice-logout-event")
def logout_published(sender, request, user, **kwargs) -> None:
    if user is None:
        return
    # Sent before Django flushes the session, so the event names it: the socket of that session
    # closes without racing the flush to re-check it.
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    account_event_publish(user_id=user.pk, kind=AccountEvent.LOGOUT, session_key=session_key)


@receiver(post_init, sender=settings.AUTH_USER_MODEL, dispatch_uid="sluice-credentials-seen")
def credentials_remembered(sender, instance, **kwargs) -> None:
    instance._sluice_credentials = _credentials(instance)


@receiver(post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="sluice-credentials-event")
def credentials_published(sender, instance, created, **kwargs) -> None:
    before = getattr(instance, "_sluice_credentials", None)
    instance._sluice_credentials = _credentials(instance)
    if created or before == instance._sluice_credentials:
        return
    user_id = instance.pk
    # After the commit: a socket that re-checked before it would still see the old password.
    transaction.on_commit(
        lambda: account_event_publish(user_id=user_id, kind=AccountEvent.CREDENTIALS)
    )


@receiver(post_save, sender=ApiKey, dispatch_uid="sluice-key-revoked-event")
def key_revocation_published(sender, instance, created, **kwargs) -> None:
    """A revoked key's open event streams re-check it (apps/api/stream_session.py)."""
    if created or not instance.revoked:
        return
    user_id = instance.user_id
    transaction.on_commit(
        lambda: account_event_publish(user_id=user_id, kind=AccountEvent.KEY_REVOKED)
    )


@receiver(post_delete, sender=ApiKey, dispatch_uid="sluice-key-deleted-event")
def key_deletion_published(sender, instance, **kwargs) -> None:
    user_id = instance.user_id
    transaction.on_commit(
        lambda: account_event_publish(user_id=user_id, kind=AccountEvent.KEY_REVOKED)
    )


@receiver(post_delete, sender=settings.AUTH_USER_MODEL, dispatch_uid="sluice-deleted-event")
def deletion_published(sender, instance, **kwargs) -> None:
    user_id = instance.pk
    transaction.on_commit(lambda: account_event_publish(user_id=user_id, kind=AccountEvent.DELETED))
