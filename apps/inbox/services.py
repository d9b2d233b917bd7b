"""The per-user inbox: messages Sluice starts itself ("your answer is ready", announcements,
suggested follow-up questions).

Any part of Sluice posts with `inbox_post`. The message is stored in PostgreSQL (unread until a
page that showed it says so), then an event naming its user goes on the inbox-events stream,
which every web process follows once for all its open inbox sockets (apps/inbox/consumers.py):
each open tab of that user gets it live. A user with no tab open finds it unread on the next
visit. An announcement is one INSERT for all its recipients and one event for every socket
("*"), each of which then reads its own user's unread messages.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone
from redis.exceptions import RedisError

from apps.accounts.models import User
from apps.admission.models import Plan, UserPlan
from apps.admission.plans import plan_decide
from apps.inbox.models import Announcement, InboxMessage
from core.redis_client import get_redis, keys

log = logging.getLogger("sluice.inbox")

Kind = InboxMessage.Kind
EVENTS_MAXLEN = 10_000  # a web process follows the stream from its start: the latest matter
UNREAD_LIMIT = 50  # what a page is handed when it opens; older unread ones wait


def inbox_post(*, user_id: int, kind: str, text: str, data: dict | None = None) -> InboxMessage:
    """Stores a message for the user and delivers it to each of their open tabs (after the
    transaction commits). Raises ValidationError for an unknown kind or data that is not a
    JSON object."""
    if kind not in Kind.values:
        raise ValidationError(f"Unknown inbox kind {kind!r}.", code="kind")
    data = data or {}
    if not isinstance(data, dict):
        raise ValidationError("Inbox data must be a JSON object.", code="data")
    message = InboxMessage.objects.create(user_id=user_id, kind=kind, text=text[:2000], data=data)
    frame = json.dumps(inbox_frame(message))
    transaction.on_commit(lambda: _publish({"user": str(user_id), "message": frame}))
    return message


def inbox_frame(message: InboxMessage) -> dict:
    """A message as the page receives it (inbox.js renders text with textContent only)."""
    return {
        "id": message.id,
        "kind": message.kind,
        "text": message.text,
        "data": message.data,
        "created": message.created.isoformat() if message.created else "",
    }


def _publish(fields: dict) -> None:
    """Never raises: the message is stored, so a page that opens later still shows it."""
    try:
        get_redis().xadd(inbox_events_key(), fields, maxlen=EVENTS_MAXLEN, approximate=True)
    except RedisError as exc:
        log.warning("inbox event for user %s not published: %s", fields.get("user"), exc)


def inbox_events_key() -> str:
    """Stream: new inbox messages, each naming its user ("*": every user); every web process
    follows it once for all its open inbox sockets."""
    return keys().inbox_events


def inbox_events_last_id() -> str:
    newest = get_redis().xrevrange(inbox_events_key(), count=1)
    return newest[0][0] if newest else "0"


def inbox_forget_conversation(*, user_id: int, conversation_id: int) -> None:
    """A deleted conversation leaves no inbox message that points at it."""
    InboxMessage.objects.filter(user_id=user_id, data__conversation_id=conversation_id).delete()


def inbox_unread_for_user(*, user_id: int, after_id: int = 0) -> list[InboxMessage]:
    """The user's unread messages (after `after_id`), oldest first, at most UNREAD_LIMIT
    (the newest of them)."""
    newest = InboxMessage.objects.filter(
        user_id=user_id, read_at__isnull=True, id__gt=after_id
    ).order_by("-id")[:UNREAD_LIMIT]
    return list(reversed(newest))


def inbox_mark_read(*, user_id: int, ids: Iterable[int]) -> int:
    """Marks the user's own messages among `ids` read; others' ids are ignored."""
    ids = [i for i in ids if isinstance(i, int) and not isinstance(i, bool)][:200]
    if not ids:
        return 0
    unread = InboxMessage.objects.filter(user_id=user_id, id__in=ids, read_at__isnull=True)
    return unread.update(read_at=timezone.now())


# -- announcements ---------------------------------------------------------------------------


def announcement_recipients_sql(plan: Plan | None) -> tuple[str, list]:
    """SELECT of the user ids an announcement reaches: active users, of `plan` when given
    (its overrides, and everyone without one when it is the default plan: plan_decide)."""
    users, overrides = User._meta.db_table, UserPlan._meta.db_table
    sql = f"SELECT u.id FROM {users} u WHERE u.is_active"
    if plan is None:
        return sql, []
    default = plan_decide(override=None, defaults=Plan.objects.filter(is_default=True))
    own = f"u.id IN (SELECT user_id FROM {overrides} WHERE plan_id = %s)"
    if default.pk == plan.pk:
        none = f"u.id NOT IN (SELECT user_id FROM {overrides})"
        return f"{sql} AND ({own} OR {none})", [plan.pk]
    return f"{sql} AND {own}", [plan.pk]


@transaction.atomic
def announcement_send(
    *, text: str, plan: Plan | None = None, author: User | None = None
) -> Announcement:
    """Stores the announcement and puts it in the inbox of each user it reaches, in one
    statement however many they are; every open tab of theirs shows it at once."""
    text = (text or "").strip()
    if not text:
        raise ValidationError("An announcement needs text.", code="empty")
    announcement = Announcement.objects.create(text=text[:1000], plan=plan, author=author)
    recipients, params = announcement_recipients_sql(plan)
    data = json.dumps({"announcement": announcement.pk})
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {InboxMessage._meta.db_table} (user_id, kind, text, data, created) "
            f"SELECT r.id, %s, %s, %s::jsonb, now() FROM ({recipients}) r",
            [Kind.ANNOUNCEMENT, announcement.text, data, *params],
        )
        announcement.recipients = cursor.rowcount
    announcement.save(update_fields=["recipients"])
    transaction.on_commit(lambda: _publish({"user": "*", "announcement": str(announcement.pk)}))
    return announcement
