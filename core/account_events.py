"""The account-events stream's one writer: events addressed to a user's open sockets (a session
ended, a password changed, a conversation changed in another tab), each naming its user. Every
web process follows the stream once for all its open sockets (apps/streams/account_watch.py)."""

from __future__ import annotations

from core.redis_client import get_redis, keys

# Events kept: a web process follows the stream from the moment it starts, so only the last few
# thousand matter.
EVENTS_MAXLEN = 10_000


def account_event_add(client, fields: dict[str, str]) -> None:
    """Adds the event on `client`: a Redis client, or a pipeline that sends it later. `fields`
    names the user ("user") and the event's "type"."""
    client.xadd(keys().account_events, fields, maxlen=EVENTS_MAXLEN, approximate=True)


def events_last_id() -> str:
    """The id of the latest account event ("0" when there is none): a socket that opens
    follows the events after it."""
    newest = get_redis().xrevrange(keys().account_events, count=1)
    return newest[0][0] if newest else "0"
