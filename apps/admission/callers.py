"""The caller behind an API key (the user and the plan rows their key's statement reads), kept
in Redis for a minute, so an API request reads no PostgreSQL on a warm cache: each request
asks for its caller before anything else, and on a machine that is not saturated a statement
to a PostgreSQL backend that has sat idle costs a few milliseconds, several times a Redis read.

One string per key, `…:{api-callers}:<the key's SHA-256>` (the hash PostgreSQL stores, never
the key): the user's id and name and the candidate plans, stamped with the shared token that
was current when they were read. One string `…:{api-callers}:token` holds that token. Any
change that can alter a caller (a key created, revoked or deleted; a user saved other than by
logging in, or deleted; a plan or a user's plan changed) sets a new random token once its
transaction commits: every entry goes stale at once. Such changes are rare, and each key's
next request reads PostgreSQL again. A reader that missed writes its entry only while the
token is the one it saw before reading PostgreSQL (a Lua check), so a change that landed
meanwhile leaves no stale entry. The token is random, not a counter: one lost to eviction or
a restart never comes back as a value an old entry holds.

Writes that send no model signal (raw SQL, `QuerySet.update()` on users or keys) reach callers
within TTL_SECONDS. A key's "last used" is written by the statement a miss runs, so it moves
at most every TTL_SECONDS plus its own resolution. A Redis that cannot be reached reads
PostgreSQL every time (the request then fails on its publication, with its own message).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS
from django.db.models.signals import post_delete, post_save
from redis.exceptions import RedisError

from apps.accounts.models import ApiKey, User
from apps.admission.models import Plan, UserPlan
from core.commits import after_commit_collect
from core.querysets import post_bulk_create, pre_update
from core.redis_client import get_redis, keys

log = logging.getLogger("sluice.admission.callers")

TTL_SECONDS = 60

# KEYS: the token, the entry. ARGV: the token the reader saw ("" none), a token to start with
# when there is none, the entry, its TTL. Written only while the token is unchanged.
_REMEMBER = """
local token = redis.call('GET', KEYS[1])
if (token or '') ~= ARGV[1] then return 0 end
if not token then
  token = ARGV[2]
  redis.call('SET', KEYS[1], token)
end
redis.call('SET', KEYS[2], token .. ' ' .. ARGV[3], 'EX', tonumber(ARGV[4]))
return 1
"""


@dataclass
class Lookup:
    """What the cache said about one key: `hit` (the user, the plan rows) or a miss, with the
    token seen (None: Redis could not be read, so nothing is written back)."""

    digest: str
    token: str | None
    hit: tuple[User, list[dict]] | None = None


def _names(digest: str) -> tuple[str, str]:
    k = keys()
    return k.api_callers_token, k.api_caller(digest)


def lookup(digest: str) -> Lookup:
    """The cached caller of the key whose SHA-256 is `digest`: one MGET."""
    token_name, entry_name = _names(digest)
    try:
        token, entry = get_redis().mget(token_name, entry_name)
    except RedisError as exc:
        log.warning("API callers cache unreadable: %s", exc)
        return Lookup(digest, None)
    if token and entry:
        stamp, _, data = entry.partition(" ")
        if stamp == token:
            found = json.loads(data)
            user = User.from_db(
                DEFAULT_DB_ALIAS, ["id", "username"], [found["user"], found["username"]]
            )
            return Lookup(digest, token, (user, found["plans"]))
    return Lookup(digest, token or "")


def remember(missed: Lookup, *, user: User, plans: list[dict]) -> None:
    """Stores what PostgreSQL said for a key the cache missed, unless something changed since
    the miss (or Redis could not be read then)."""
    if missed.token is None:
        return
    token_name, entry_name = _names(missed.digest)
    entry = json.dumps(
        {"user": user.pk, "username": user.get_username(), "plans": plans}, separators=(",", ":")
    )
    try:
        get_redis().eval(
            _REMEMBER, 2, token_name, entry_name, missed.token, uuid.uuid4().hex, entry, TTL_SECONDS
        )
    except RedisError as exc:
        log.warning("API caller not cached: %s", exc)


def forget_all() -> None:
    """Every cached caller goes stale: a new token."""
    try:
        get_redis().set(_names("")[0], uuid.uuid4().hex)
    except RedisError as exc:  # the entries then expire on their own
        log.warning(
            "API callers cache not cleared (entries expire within %ss): %s", TTL_SECONDS, exc
        )


def _changed(sender, **kwargs) -> None:
    """Once the current transaction commits, every cached caller goes stale."""
    if sender is User:
        fields = kwargs.get("update_fields")
        if fields is not None and set(fields) <= {"last_login"}:
            return  # a login changes nothing a caller holds
    after_commit_collect(
        "api-callers",
        add=lambda batch: batch.update(changed=True),
        apply=lambda batch: forget_all(),
        empty=dict,
    )


def connect() -> None:
    for model in (ApiKey, User, Plan, UserPlan):
        name = model.__name__
        post_save.connect(_changed, sender=model, dispatch_uid=f"api-callers-{name}-save")
        post_delete.connect(_changed, sender=model, dispatch_uid=f"api-callers-{name}-delete")
    for model in (Plan, UserPlan):
        name = model.__name__
        pre_update.connect(_changed, sender=model, dispatch_uid=f"api-callers-{name}-update")
        post_bulk_create.connect(_changed, sender=model, dispatch_uid=f"api-callers-{name}-bulk")
