"""A request's live state as its owner may see it, and its stop: read from and written to the
request's hash in Redis, never PostgreSQL (a request lives there until it ends)."""

from __future__ import annotations

from dataclasses import dataclass

from django.http import Http404

from apps.accounts.models import User
from core.redis_client import get_redis, keys
from worker import protocol, transitions


@dataclass
class RequestInfo:
    id: str
    user_id: int
    conversation_id: int | None  # None: a stateless API request (/v1/chat/completions)
    state: str


def request_get_for_user(*, user: User, request_id: str) -> RequestInfo:
    """The request's live state; Http404 when it is unknown, expired or someone else's."""
    if not request_id or len(request_id) > 64:
        raise Http404
    data = get_redis().hgetall(keys().request(request_id))
    if not data or data.get("user_id") != str(user.id):
        raise Http404
    conversation_id = data.get("conversation_id")
    return RequestInfo(
        request_id,
        int(data["user_id"]),
        int(conversation_id) if conversation_id else None,
        data.get("state", ""),
    )


def request_cancel(*, user: User, request_id: str) -> RequestInfo:
    """Stops the request: a worker checks the flag between batches and frees its slot; the
    dispatcher ends it at once if it is still waiting in line."""
    info = request_get_for_user(user=user, request_id=request_id)
    if info.state not in protocol.TERMINAL_STATES:
        pipe = get_redis().pipeline(transaction=False)
        transitions.stopped(pipe, keys(), request_id)
        pipe.execute()
    return info
