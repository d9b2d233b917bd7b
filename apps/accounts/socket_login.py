"""A websocket's login: the user of its session cookie, checked as Django checks a request's.

Channels' `get_user` loads the session and then the user through the ORM, and the socket then
checked the session again (SessionCheck) before it read anything: three queries, two of them
built by the ORM, and the session decoded twice. The ORM spends more CPU compiling those small
queries than PostgreSQL spends answering them, and a socket opens with every page (and every
page reconnects at once when a web process restarts). Here the login is two plain statements
(the session, then its user) and it leaves the socket's SessionCheck passed, so the socket's
first write checks the session in its own statement with no query of its own.

Sessions not kept in the database, or a login by a backend other than Django's ModelBackend,
go the general way (Channels' lookup, then a full SessionCheck).

Measured on and off (bench/ab.py, the reconnect bench: 300 pages' two sockets opened at once;
"before" is the release whose logins, frames and closes ran through Channels' own helpers):
`bench/ab.py 2285c36 reconnect --pairs 2 -- --pages 300 --rounds 2`: all open in 4044 -> 3477
ms, handshake p50 3130 -> 2036 ms, web CPU 5.83 -> 5.22 ms per socket (-10 %), lower in every
pair; with the plain-statement login, `bench/ab.py 6ae5ffb reconnect --pairs 2 -- --pages 300
--rounds 2`: 6.81 -> 5.12 ms per socket, 12 -> 0 sockets dropped. Kept for that; it relies on
Channels 4.3's consumer and middleware behaviour (pyproject pins channels to 4.3.x).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import import_module

from channels.auth import get_user
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.auth.models import AnonymousUser
from django.contrib.sessions.backends.base import SessionBase
from django.contrib.sessions.models import Session
from django.db import connection
from redis.exceptions import RedisError

from apps.accounts.sessions import DATABASE_SESSION_ENGINES, SessionCheck
from core.account_events import events_last_id

MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


@dataclass(frozen=True)
class SocketLogin:
    user: object  # the User, or AnonymousUser when the cookie logs no one in
    session: SessionCheck  # passed when `user` is someone: the socket's later checks
    events_after: str  # the socket follows the user's account events after this id


def socket_login(session_key: str | None) -> SocketLogin:
    """The login of a socket whose cookie names `session_key`. In a pool thread.

    The account events' last id is read first: an event (a logout) published after the
    session was read then comes after it, and the socket hears of it."""
    try:
        events_after = events_last_id()
    except RedisError:
        events_after = "0"  # every event the stream still holds: at worst one more check
    if settings.SESSION_ENGINE not in DATABASE_SESSION_ENGINES:
        return _general_login(session_key, events_after)
    data = _session_data(session_key)
    user_id = data.get(SESSION_KEY)
    backend = data.get(BACKEND_SESSION_KEY)
    if backend != MODEL_BACKEND and backend in settings.AUTHENTICATION_BACKENDS:
        return _general_login(session_key, events_after)
    if user_id is None or backend not in settings.AUTHENTICATION_BACKENDS:
        return SocketLogin(AnonymousUser(), SessionCheck(session_key=None, user_id=0), events_after)
    user = _active_user(user_id)
    check = SessionCheck(session_key=session_key, user_id=user.pk if user else 0)
    if user is None or not check.passed(data, password=user.password):
        return SocketLogin(AnonymousUser(), check, events_after)
    return SocketLogin(user, check, events_after)


def _session_data(session_key: str | None) -> dict:
    """The session's decoded data; {} when it is missing, expired or tampered with."""
    if not session_key or not isinstance(session_key, str) or len(session_key) > 40:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(_session_sql(), [session_key])
        row = cursor.fetchone()
    if row is None:
        return {}
    return _decoder().decode(row[0])


def _active_user(user_id) -> object | None:
    """The user, as ModelBackend.get_user gives it: None unless it exists and is active."""
    model = get_user_model()
    try:
        pk = model._meta.pk.to_python(user_id)
    except Exception:  # a session naming no valid id logs no one in
        return None
    names = _user_fields()
    with connection.cursor() as cursor:
        cursor.execute(_user_sql(), [pk])
        row = cursor.fetchone()
    if row is None:
        return None
    user = model.from_db(connection.alias, names, row)
    return user if getattr(user, "is_active", True) else None


def _general_login(session_key: str | None, events_after: str) -> SocketLogin:
    """Channels' lookup, for the configurations the plain statements do not cover."""
    store = import_module(settings.SESSION_ENGINE).SessionStore
    user = get_user.func({"session": store(session_key=session_key)})
    check = SessionCheck(session_key=session_key, user_id=getattr(user, "pk", None) or 0)
    if user.is_authenticated and not check.current():
        user = AnonymousUser()
    return SocketLogin(user, check, events_after)


@functools.cache
def _decoder() -> SessionBase:
    return import_module(settings.SESSION_ENGINE).SessionStore()


@functools.cache
def _session_sql() -> str:
    return (
        f"SELECT session_data FROM {Session._meta.db_table} "
        "WHERE session_key = %s AND expire_date > now()"
    )


@functools.cache
def _user_fields() -> list[str]:
    return [field.attname for field in get_user_model()._meta.concrete_fields]


@functools.cache
def _user_sql() -> str:
    model = get_user_model()
    columns = ", ".join(
        connection.ops.quote_name(field.column) for field in model._meta.concrete_fields
    )
    pk = connection.ops.quote_name(model._meta.pk.column)
    return f"SELECT {columns} FROM {model._meta.db_table} WHERE {pk} = %s"
