"""Whether a login session still stands, and the account events that make open websockets ask.

A websocket is authenticated once, when it opens; Django re-checks a session only on each HTTP
request. So an open socket would outlive a logout, a password change or a deactivation. Each of
those publishes an event on the account-events stream (keys().account_events), which every web
process follows once for all its open sockets (apps/streams/account_watch.py); a socket of that
user then re-checks its own session here and closes if it no longer stands. Every frame
re-checks it too, so a socket that missed an event (Redis was down when it was published) still
cannot act for a dead session.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import TypeVar

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.models import Session
from django.db import connection
from django.utils.crypto import constant_time_compare, salted_hmac
from redis.exceptions import RedisError

from core.account_events import account_event_add
from core.redis_client import get_redis

log = logging.getLogger("sluice.accounts.sessions")

T = TypeVar("T")

DATABASE_SESSION_ENGINES = (
    "django.contrib.sessions.backends.db",
    "django.contrib.sessions.backends.cached_db",
)


class AccountEvent:
    LOGOUT = "logout"  # one session ended; its digest is in "session"
    CREDENTIALS = "credentials"  # password or active flag changed: every session re-checks
    DELETED = "deleted"
    KEY_REVOKED = "key_revoked"  # an API key was revoked: its open streams re-check it


def session_digest(session_key: str | None) -> str:
    """Names a session in events without putting its key (a bearer credential) in Redis."""
    return hashlib.sha256((session_key or "").encode()).hexdigest()[:24]


def account_event_publish(*, user_id: int, kind: str, session_key: str | None = None) -> None:
    """Tells the user's open sockets to re-check their sessions. Never raises: a logout must
    work while Redis is down, and the sockets' per-frame checks still hold then."""
    fields = {
        "user": str(user_id),
        "type": kind,
        "session": session_digest(session_key) if session_key else "",
    }
    try:
        account_event_add(get_redis(), fields)
    except RedisError as exc:
        log.warning("account event %s for user %s not published: %s", kind, user_id, exc)


class SessionEnded(Exception):
    """The login session behind a socket no longer stands (logout, password change,
    deactivation, expiry)."""


@dataclass(frozen=True)
class SqlCondition:
    """A condition for a statement's WHERE clause, with its named parameters."""

    sql: str
    params: dict


class SessionCheck:
    """Whether one socket's session still logs in its user, as Django's own check on each
    request would find: the session exists and has not expired, it belongs to that user through
    a configured backend, the user is active, and the session was made with the user's current
    password. The session is decoded once (its auth fields change only with a new key); each
    later check is one indexed query with database-backed sessions, or no query of its own
    where the write it guards carries it (`condition`)."""

    def __init__(self, *, session_key: str | None, user_id: int) -> None:
        self.session_key = session_key
        self.user_id = user_id
        self._auth_hash: str | None = None  # from the session, once it was decoded and valid
        self._password: str | None = None  # the password hash the last passed check matched

    def require(self) -> None:
        """Raises SessionEnded unless the session stands."""
        if not self.current():
            raise SessionEnded

    def current(self) -> bool:
        self._password = None  # set again below only if this check passes
        if not self.session_key:
            return False
        if settings.SESSION_ENGINE not in DATABASE_SESSION_ENGINES:
            return self._decoded_current(_session_store_class()(self.session_key).load())
        with connection.cursor() as cursor:
            cursor.execute(_check_sql(), [self.session_key, self.user_id])
            row = cursor.fetchone()
        if row is None:  # no such user
            return False
        password, is_active, session_data = row
        if not is_active or session_data is None:
            return False
        if self._auth_hash is None:
            if not self._decoded_current(_session_store_class()().decode(session_data)):
                return False
        return self._matches(password)

    def passed(self, data: dict, *, password: str) -> bool:
        """The full check on a session already read from the database and decoded (`data`)
        and its user's password hash, read with it (a socket's login): True leaves this check
        as passed as `current()` would, so `condition()` is ready."""
        self._password = None
        return self._decoded_current(data) and self._matches(password)

    def _matches(self, password: str) -> bool:
        matches = _hash_matches(self._auth_hash, password)
        self._password = password if matches else None
        return matches

    def guarded(self, write: Callable[[SqlCondition | None], T]) -> T:
        """`write(condition)`, for a write that checks the session in its own statement (see
        `condition`; None: it was checked in full just before). When the write fails, the
        session is checked in full before the error goes on, so that a caller whose session
        ended hears only that (SessionEnded)."""
        condition = self.condition()
        if condition is None:
            self.require()
        try:
            return write(condition)
        except Exception:
            if condition is not None:
                self.require()
            raise

    def condition(self) -> SqlCondition | None:
        """This check as an SQL condition, for a write that must happen only while the session
        stands: the write then checks it in its own statement, one round trip for both. True
        exactly when `current()` would be: the session's own fields were checked once already,
        and its auth hash matched the password hash read then, so an unchanged password hash
        gives the same answer. None until a check has passed, or when sessions are not kept in
        the database (the caller then calls `require()` first)."""
        if self._password is None or settings.SESSION_ENGINE not in DATABASE_SESSION_ENGINES:
            return None
        return SqlCondition(
            _condition_sql(),
            {
                "session_key": self.session_key,
                "session_user": self.user_id,
                "session_password": self._password,
            },
        )

    def _decoded_current(self, data: dict) -> bool:
        """Checks the session's own fields and remembers its auth hash."""
        if not data or str(data.get(SESSION_KEY)) != str(self.user_id):
            return False
        if data.get(BACKEND_SESSION_KEY) not in settings.AUTHENTICATION_BACKENDS:
            return False
        self._auth_hash = data.get(HASH_SESSION_KEY) or ""
        if settings.SESSION_ENGINE in DATABASE_SESSION_ENGINES:
            return True  # the caller compares the hash with the password it read
        user = get_user_model().objects.filter(pk=self.user_id, is_active=True).first()
        return user is not None and _hash_matches(self._auth_hash, user.password)


def _session_store_class():
    return import_module(settings.SESSION_ENGINE).SessionStore


@functools.cache
def _check_sql() -> str:
    users = get_user_model()._meta.db_table
    sessions = Session._meta.db_table
    # The session is read only when the user exists: one row, or none for a deleted user.
    return (
        f"SELECT u.password, u.is_active, s.session_data FROM {users} u "
        f"LEFT JOIN {sessions} s ON s.session_key = %s AND s.expire_date > now() "
        "WHERE u.id = %s"
    )


@functools.cache
def _condition_sql() -> str:
    users = get_user_model()._meta.db_table
    sessions = Session._meta.db_table
    return (
        f"EXISTS (SELECT 1 FROM {users} u JOIN {sessions} s "
        "ON s.session_key = %(session_key)s AND s.expire_date > now() "
        "WHERE u.id = %(session_user)s AND u.is_active "
        "AND u.password = %(session_password)s)"
    )


def _hash_matches(session_hash: str | None, password: str) -> bool:
    """Django's session auth hash (AbstractBaseUser.get_session_auth_hash) of `password`,
    compared with the one the session was made with, under the key and its fallbacks."""
    if not session_hash:
        return False
    salt = "django.contrib.auth.models.AbstractBaseUser.get_session_auth_hash"
    for secret in (settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS):
        expected = salted_hmac(salt, password, secret=secret, algorithm="sha256").hexdigest()
        if constant_time_compare(session_hash, expected):
            return True
    return False
