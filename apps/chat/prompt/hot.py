"""The hot tier: what every prompt needs, kept in Redis so the submit path reads no PostgreSQL
on a warm cache.

Per conversation, a hash (its summary, the turns it pinned, a generation, whether it is filled)
and a capped list of its latest finished turns, newest first; per user, a hash with the prompt
profile and the system prompt made from it (by prompting.system_prompt, passed in). All
expire after HOT_TIER_TTL_SECONDS without use.

Writes go through: a stored turn is pushed onto its conversation's list (only while the list
is filled: a list is either complete up to its cap or absent), any other change (a deleted or
edited message, a pin, a new summary, a profile or tag edit) drops what it changed, and a
deleted conversation drops its keys. A reader that missed reads PostgreSQL and fills the cache
only if the generation it saw before reading is still current, so a write that landed in
between can never be overwritten by older data; a turn pushed twice (a fill raced a push) is
read once, as list entries carry the message id.

HOT_TIER=false turns it off (bench/submit.py measures both): every read then goes to
PostgreSQL, as before.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict

from django.conf import settings
from redis.exceptions import RedisError

from apps.chat import selectors
from apps.chat.models import Conversation, Message
from apps.chat.selectors import PromptProfile, PromptSources, Turn
from core.commits import after_commit, commit_pending
from core.redis_client import get_redis, keys

# -- the Lua scripts: each reads or writes a conversation's hash and list together, so no reader
# sees one without the other.

# KEYS: conversation hash, turns list. ARGV: ttl, last list index to read. Returns the hash's
# generation and, when it is filled, its fields and the turns; refreshes both TTLs.
READ = """
local conv = redis.call('HMGET', KEYS[1], 'gen', 'filled', 'summary', 'upto', 'pinned', 'facts')
redis.call('EXPIRE', KEYS[1], ARGV[1])
if conv[2] ~= '1' then return {conv[1], false} end
redis.call('EXPIRE', KEYS[2], ARGV[1])
return {conv[1], conv[2], conv[3], conv[4], conv[5],
        redis.call('LRANGE', KEYS[2], 0, tonumber(ARGV[2])), conv[6]}
"""
# KEYS: conversation hash, turns list. ARGV: ttl, cap, entries (oldest first).
PUSH = """
redis.call('HINCRBY', KEYS[1], 'gen', 1)
if redis.call('HGET', KEYS[1], 'filled') == '1' then
  for i = 3, #ARGV do redis.call('LPUSH', KEYS[2], ARGV[i]) end
  redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[2]) - 1)
  redis.call('EXPIRE', KEYS[2], ARGV[1])
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
"""
# KEYS: a hash (and its list, if any). ARGV: ttl.
FORGET = """
redis.call('HINCRBY', KEYS[1], 'gen', 1)
redis.call('HDEL', KEYS[1], 'filled', 'system')
if KEYS[2] then redis.call('DEL', KEYS[2]) end
redis.call('EXPIRE', KEYS[1], ARGV[1])
"""
# KEYS: conversation hash, turns list. ARGV: ttl, generation seen, summary, upto, pinned,
# memory entries (JSON), turns (newest first).
FILL_CONVERSATION = """
local gen = redis.call('HGET', KEYS[1], 'gen') or '0'
if gen ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[2])
for i = 7, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
redis.call('HSET', KEYS[1], 'gen', gen, 'filled', '1', 'summary', ARGV[3], 'upto', ARGV[4],
           'pinned', ARGV[5], 'facts', ARGV[6])
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[1])
return 1
"""
# KEYS: profile hash. ARGV: ttl, generation seen, profile JSON, system prompt (if made).
FILL_PROFILE = """
local gen = redis.call('HGET', KEYS[1], 'gen') or '0'
if gen ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'gen', gen, 'filled', '1', 'profile', ARGV[3])
if ARGV[4] then redis.call('HSET', KEYS[1], 'system', ARGV[4]) end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""

log = logging.getLogger("sluice.chat.hot")

DONE = Message.Status.DONE
ROLES = (Message.Role.USER, Message.Role.ASSISTANT)


def conversation_key(conversation_id: int | str) -> str:
    """Hash: a conversation's summary, pinned turns, generation and whether it is filled. It
    shares its hash tag with the list, so the scripts touching both work in a Redis Cluster."""
    return keys().hot_conversation(conversation_id)


def turns_key(conversation_id: int | str) -> str:
    """List: a conversation's latest finished turns, newest first, capped."""
    return keys().hot_turns(conversation_id)


def profile_key(user_id: int | str) -> str:
    """Hash: a user's prompt profile and the system prompt made from it."""
    return keys().hot_profile(user_id)


def enabled() -> bool:
    return settings.HOT_TIER


def _ttl() -> int:
    return settings.HOT_TIER_TTL_SECONDS


def _entry(turn: Turn) -> str:
    return json.dumps([turn.id, turn.role, turn.text, turn.pinned])


def _turns(raw: list[str], limit: int) -> list[Turn]:
    """List entries as turns, newest first, each message once. A long conversation's hundred
    entries are decoded in one call, not one each."""
    seen, turns = set(), []
    for message_id, role, text, pinned in json.loads(f"[{','.join(raw)}]"):
        if message_id not in seen:
            seen.add(message_id)
            turns.append(Turn(message_id, role, text, pinned))
            if len(turns) == limit:
                break
    return turns


# -- reading ---------------------------------------------------------------------------------


def prompt_sources(
    *,
    conversation: Conversation,
    limit: int,
    pushed: Turn | None = None,
) -> PromptSources:
    """selectors.prompt_sources, from Redis when both the conversation and its owner are hot;
    else from PostgreSQL (one round trip), filling what was missing. `pushed`: a turn of this
    conversation just committed (the question being asked), pushed in the same round trip,
    before the read."""
    cap = settings.HOT_TIER_TURNS
    if not enabled() or limit > cap:
        if pushed is not None:
            turns_stored({conversation.pk: [pushed]})
        return selectors.prompt_sources(conversation=conversation, limit=limit)

    conv_key, list_key = conversation_key(conversation.pk), turns_key(conversation.pk)
    try:
        pipe = get_redis().pipeline(transaction=False)
        if pushed is not None:
            _push(pipe, conversation.pk, [pushed])
        sources_queue(pipe, conversation, limit)
        conv, profile, _ = pipe.execute()[-3:]
    except RedisError as exc:
        log.warning("hot tier unreadable (%s): reading PostgreSQL", exc)
        if pushed is not None:  # perhaps not pushed: what it holds must go
            _drop_keys([conv_key, list_key])
        return selectors.prompt_sources(conversation=conversation, limit=limit)
    found = sources_from([conv, profile], limit)
    if found is not None:
        return found
    conv_gen, conv_filled = conv[0], conv[1]
    profile_gen, profile_filled, _ = profile
    sources = selectors.prompt_sources(conversation=conversation, limit=cap)
    try:
        pipe = get_redis().pipeline(transaction=False)
        if conv_filled != "1":
            pinned_json = json.dumps([[t.id, t.role, t.text, t.pinned] for t in sources.pinned])
            pipe.eval(
                FILL_CONVERSATION,
                2,
                conv_key,
                list_key,
                _ttl(),
                conv_gen or "0",
                sources.summary,
                sources.summary_upto,
                pinned_json,
                json.dumps(sources.facts),
                *(_entry(t) for t in sources.history),
            )
        if profile_filled != "1":
            pipe.eval(
                FILL_PROFILE,
                1,
                profile_key(conversation.owner_id),
                _ttl(),
                profile_gen or "0",
                _profile_json(sources.profile),
            )
        pipe.execute()
    except RedisError as exc:
        log.warning("hot tier not filled: %s", exc)
    sources.history = sources.history[:limit]
    return sources


def sources_queue(pipe, conversation: Conversation, limit: int) -> None:
    """Queues the read of a prompt's sources on `pipe` (three commands): `sources_from` makes
    them of the replies."""
    # Room for a turn pushed twice (a fill raced its push): read a few more than needed.
    pipe.eval(
        READ, 2, conversation_key(conversation.pk), turns_key(conversation.pk), _ttl(), limit + 8
    )
    pipe.hmget(profile_key(conversation.owner_id), "gen", "filled", "profile")
    pipe.expire(profile_key(conversation.owner_id), _ttl())


def sources_from(replies: list, limit: int, newer: Sequence[Turn] = ()) -> PromptSources | None:
    """The prompt's sources from the first two replies to `sources_queue`'s commands; None
    when the conversation or its owner is not in the tier. `newer`: turns stored after the
    read (newest first), ahead of those read."""
    conv, profile = replies[:2]
    conv_filled, summary, upto, pinned, raw_turns, entries = (conv + [None] * 7)[1:7]
    if conv_filled != "1" or profile[1] != "1":
        return None
    history = _turns(raw_turns, limit)
    if newer:
        ids = {turn.id for turn in newer}
        history = [*newer, *(turn for turn in history if turn.id not in ids)][:limit]
    return PromptSources(
        history=history,
        profile=_profile_from(profile[2]),
        summary=summary or "",
        summary_upto=int(upto or 0),
        pinned=[Turn(*t) for t in json.loads(pinned or "[]")],
        facts=json.loads(entries or "[]"),
    )


def _profile_json(profile: PromptProfile | None) -> str:
    return json.dumps(asdict(profile) if profile else None)


def _profile_from(raw: str | None) -> PromptProfile | None:
    data = json.loads(raw or "null")
    return PromptProfile(**data) if data else None


def system_prompt_for(user_id: int, *, render: Callable[[PromptProfile | None], str]) -> str:
    """The user's system prompt (`render` makes it from the profile), from the hot tier when
    it holds it; else made and kept there."""
    if not enabled():
        return render(selectors.prompt_profile(user_id=user_id))
    key = profile_key(user_id)
    try:
        gen, filled, profile_json, system = get_redis().hmget(
            key, "gen", "filled", "profile", "system"
        )
    except RedisError:
        return render(selectors.prompt_profile(user_id=user_id))
    if filled == "1" and system is not None:
        return system
    profile = (
        _profile_from(profile_json) if filled == "1" else selectors.prompt_profile(user_id=user_id)
    )
    system = render(profile)
    try:
        get_redis().eval(FILL_PROFILE, 1, key, _ttl(), gen or "0", _profile_json(profile), system)
    except RedisError as exc:
        log.warning("hot tier not filled: %s", exc)
    return system


# -- writing through -------------------------------------------------------------------------


def turns_stored(turns_by_conversation: dict[int, list[Turn]]) -> None:
    """New finished turns (oldest first) pushed onto their conversations' lists. Never raises:
    a Redis that is away then holds a list that the TTL ends (and the generation bump fails
    too, so no reader fills it with older data either way)."""
    if not turns_by_conversation or not enabled():
        return
    try:
        pipe = get_redis().pipeline(transaction=False)
        for conversation_id, turns in turns_by_conversation.items():
            _push(pipe, conversation_id, turns)
        pipe.execute()
    except RedisError as exc:
        log.warning("hot tier not written (%s): dropping it", exc)
        turns_unwritten(turns_by_conversation)


def turns_push(pipe, turns_by_conversation: dict[int, list[Turn]]) -> None:
    """`turns_stored` queued on the caller's pipeline, for turns committed already. A caller
    whose pipeline fails calls `turns_unwritten`."""
    if enabled():
        for conversation_id, turns in turns_by_conversation.items():
            _push(pipe, conversation_id, turns)


def turns_unwritten(turns_by_conversation: dict[int, list[Turn]]) -> None:
    """Pushes that may have failed: those conversations' entries are dropped (a reader
    refills them from PostgreSQL)."""
    _drop_keys(
        [conversation_key(c) for c in turns_by_conversation]
        + [turns_key(c) for c in turns_by_conversation]
    )


def _push(pipe, conversation_id: int, turns: list[Turn]) -> None:
    pipe.eval(
        PUSH,
        2,
        conversation_key(conversation_id),
        turns_key(conversation_id),
        _ttl(),
        settings.HOT_TIER_TURNS,
        *(_entry(t) for t in turns),
    )


def turn_of(message: Message) -> Turn | None:
    """The message as a prompt's turn; None unless it is a finished turn and the tier is on."""
    if message.role in ROLES and message.status == DONE and enabled():
        return Turn(message.id, message.role, message.text, False)
    return None


def message_stored(message: Message) -> None:
    """After services.message_store: the message, if it is a finished turn (once committed:
    a turn rolled back never reaches a prompt)."""
    turn = turn_of(message)
    if turn is not None:
        after_commit(lambda: turns_stored({message.conversation_id: [turn]}))


def pushes_now() -> bool:
    """Whether a message stored now counts as committed at once (as for `after_commit`), so
    that its caller may push it itself, in a round trip of its own choosing."""
    return not commit_pending()


def messages_stored(turns: list[tuple[int, Turn]]) -> None:
    """After a batch of answers (services.messages_store): (conversation id, turn) of each
    stored message, pushed once committed, when it is a finished turn."""
    by_conversation: dict[int, list[Turn]] = {}
    for conversation_id, turn in turns:
        if turn.role in ROLES:
            by_conversation.setdefault(conversation_id, []).append(turn)
    if by_conversation and enabled():
        after_commit(lambda: turns_stored(by_conversation))


def conversations_forget(conversation_ids) -> None:
    """Their turns, summary and pins are dropped (the next prompt refills them)."""
    _forget([(conversation_key(c), turns_key(c)) for c in set(conversation_ids)])


def profiles_forget(user_ids) -> None:
    _forget([(profile_key(u), None) for u in set(user_ids)])


def conversations_drop(conversation_ids) -> None:
    """A deleted conversation: its keys are gone."""
    _drop_keys([key for c in set(conversation_ids) for key in (conversation_key(c), turns_key(c))])


def _forget(pairs: list[tuple[str, str | None]]) -> None:
    if not pairs:
        return
    try:
        pipe = get_redis().pipeline(transaction=False)
        for hash_key, list_key in pairs:
            if list_key:
                pipe.eval(FORGET, 2, hash_key, list_key, _ttl())
            else:
                pipe.eval(FORGET, 1, hash_key, _ttl())
        pipe.execute()
    except RedisError as exc:
        log.error("hot tier entries not dropped (%s): they expire within %ss", exc, _ttl())


def _drop_keys(names: list[str]) -> None:
    if not names:
        return
    try:
        pipe = get_redis().pipeline(transaction=False)
        for name in names:  # one by one: in a cluster they live in different slots
            pipe.delete(name)
        pipe.execute()
    except RedisError as exc:
        log.error("hot tier keys not deleted (%s): they expire within %ss", exc, _ttl())
