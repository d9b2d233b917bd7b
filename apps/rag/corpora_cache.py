"""The corpora each user may search, kept in Redis beside the chat's hot tier, so sending a
message reads no PostgreSQL on a warm cache.

Per user, a hash `…:hot:{u<id>}:corpora` (the hash tag the user's hot-tier profile carries):
the corpus rows the user may search (JSON), the user's generation, and the shared token it was
filled under. One string `…:hot:{corpora}:shared` holds the shared token. An entry is good
while its token is the current one and nobody dropped it since it was read:

- a change that can alter anybody's answer (a shared corpus, its groups, a plan, a group
  deleted) sets a new shared token: every entry goes stale at once;
- a change that alters only some users' answers (their group memberships, their own plan,
  their private corpus) drops just their entries and bumps their generation.

The token is random, not a counter: a token lost to eviction or a restart never comes back
as a value some old entry still holds. A reader that missed fills its entry only if the user's
generation is unchanged since it read (a Lua check), and stamps it with the shared token it
saw *before* reading PostgreSQL, so a change that landed meanwhile leaves it stale, never
wrong. Changes are applied once their transaction commits (signals.py collects them): before
that, a reader would refill from the old rows.

HOT_TIER=false, or a Redis that cannot be reached, reads PostgreSQL every time: a submit never
fails because of this cache.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date, datetime
from functools import cache

from django.conf import settings
from redis.exceptions import RedisError

from apps.rag.models import Corpus
from core.commits import after_commit_collect, batch_pending
from core.redis_client import get_redis, keys

log = logging.getLogger("sluice.rag.corpora_cache")

# KEYS: the user's hash. ARGV: ttl, generation seen, shared token seen, rows JSON.
FILL = """
local gen = redis.call('HGET', KEYS[1], 'gen') or '0'
if gen ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'gen', gen, 'shared', ARGV[3], 'rows', ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""
# KEYS: the user's hash. ARGV: ttl.
DROP = """
redis.call('HINCRBY', KEYS[1], 'gen', 1)
redis.call('HDEL', KEYS[1], 'shared', 'rows')
redis.call('EXPIRE', KEYS[1], ARGV[1])
"""


@cache
def _fields() -> tuple:
    return tuple(Corpus._meta.concrete_fields)


@cache
def _names() -> list[str]:
    return [field.attname for field in _fields()]


def user_key(user_id: int | str) -> str:
    return keys().hot_corpora(user_id)


def shared_key() -> str:
    return keys().hot_corpora_shared


def _ttl() -> int:
    return settings.HOT_TIER_TTL_SECONDS


# -- reading ---------------------------------------------------------------------------------


def searchable(
    *, user_id: int, load: Callable[[], list[Corpus]], read: Read | None = None
) -> list[Corpus]:
    """The user's searchable corpora from Redis when the entry is good; else `load()`
    (PostgreSQL), kept for next time. `read`: the entry as read already on a caller's
    round trip."""
    if not settings.HOT_TIER or _changed_in_this_transaction():
        # A transaction that changed access reads its own view, and keeps it out of the
        # cache: it may yet be rolled back.
        return load()
    key = user_key(user_id)
    if read is None or read.replies is None or read.user_id != user_id:
        try:
            pipe = get_redis().pipeline(transaction=False)
            read = Read(user_id)
            read.queue(pipe)
            read.received(pipe.execute())
        except RedisError as exc:
            log.warning("corpora cache unreadable (%s): reading PostgreSQL", exc)
            return load()
    token, (gen, filled_under, rows), _ = read.replies
    if rows is not None and token is not None and filled_under == token:
        try:
            return _decode(rows)
        except (ValueError, TypeError) as exc:  # rows of another release's Corpus: refilled
            log.info("corpora cache entry of another shape (%s): reading PostgreSQL", exc)
    try:
        if token is None:  # first use, or lost: a fresh one, the same for every reader, made
            # before PostgreSQL is read, so a change committed meanwhile still replaces it
            get_redis().set(shared_key(), uuid.uuid4().hex, nx=True)
            token = get_redis().get(shared_key())
    except RedisError as exc:
        log.warning("corpora cache unavailable (%s): reading PostgreSQL", exc)
        return load()
    corpora = load()
    try:
        get_redis().eval(FILL, 1, key, _ttl(), gen or "0", token, _encode(corpora))
    except RedisError as exc:
        log.warning("corpora cache not filled: %s", exc)
    return corpora


@dataclass
class Read:
    """`searchable`'s read of one user's entry, for a caller to queue on a pipeline of its own
    (a submit reads Redis first anyway: one round trip fewer), then hand to `searchable`."""

    user_id: int
    replies: list | None = None
    queued: bool = False
    COMMANDS = 3  # two slots: no MULTI, no Lua

    def queue(self, pipe) -> None:
        if not settings.HOT_TIER:
            return  # nothing cached to read
        key = user_key(self.user_id)
        pipe.get(shared_key())
        pipe.hmget(key, "gen", "shared", "rows")
        pipe.expire(key, _ttl())
        self.queued = True

    def received(self, replies: list) -> None:
        """The replies from `queue`'s commands on, in order; an error among them leaves the
        read undone (`searchable` then reads again)."""
        own = replies[: self.COMMANDS] if self.queued else []
        failed = len(own) < self.COMMANDS or any(isinstance(r, Exception) for r in own)
        self.replies = None if failed else own


def _encode(corpora: list[Corpus]) -> str:
    rows = [[getattr(corpus, name) for name in _names()] for corpus in corpora]
    return json.dumps(rows, default=_isoformat)


def _isoformat(value):
    if isinstance(value, date | datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _decode(raw: str) -> list[Corpus]:
    fields, names = _fields(), _names()
    return [
        Corpus.from_db(
            "default",
            names,
            [field.to_python(value) for field, value in zip(fields, row, strict=True)],
        )
        for row in json.loads(raw)
    ]


# -- invalidating ----------------------------------------------------------------------------


def changed(*, shared: bool = False, users: Iterable[int] = ()) -> None:
    """Entries that a change in this transaction makes wrong: everybody's (`shared`) or
    `users`'. Applied once, when the transaction commits (at once outside one)."""
    users = {int(u) for u in users if u is not None}
    if not shared and not users:
        return

    def add(batch: dict) -> None:
        batch["shared"] = batch["shared"] or shared
        batch["users"] |= users

    after_commit_collect(
        "corpora", add=add, apply=_apply, empty=lambda: {"shared": False, "users": set()}
    )


def _changed_in_this_transaction() -> bool:
    return batch_pending("corpora")


def _apply(batch: dict) -> None:
    shared, users = batch["shared"], batch["users"]
    try:
        pipe = get_redis().pipeline(transaction=False)
        if shared:
            pipe.set(shared_key(), uuid.uuid4().hex)
        for user_id in users:  # one by one: in a cluster they live in different slots
            pipe.eval(DROP, 1, user_key(user_id), _ttl())
        pipe.execute()
    except RedisError as exc:
        log.error("corpora cache not invalidated (%s): entries expire within %ss", exc, _ttl())
