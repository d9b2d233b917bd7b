"""The Lua scripts behind contract/transitions.py: each touches only one request's keys (its hash
tag) or one conversation's, so it stays valid on a Redis Cluster."""

from __future__ import annotations

_ENDED = (
    "local s = redis.call('HGET', KEYS[1], 'state') "
    "if s == 'done' or s == 'failed' or s == 'cancelled' then return 0 end "
)

# KEYS: request hash, output stream, cancel flag
# Every start is an attempt (readers drop the text of earlier ones); those handed back unfinished
# by a stopping worker are not charged against the most a request may have.
# ARGV: token, worker, now ms, request ttl, output ttl, output maxlen, max attempts (0: any),
#       prompt tokens (what the model reads before its first word: the page says so meanwhile)
START = (
    _ENDED
    + """
local attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
local charged = attempt - (tonumber(redis.call('HGET', KEYS[1], 'handed_back')) or 0)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'worker', ARGV[2], 'updated_ms', ARGV[3], 'seq', 0)
redis.call('EXPIRE', KEYS[1], ARGV[4])
if redis.call('EXISTS', KEYS[3]) == 1 then return {2, attempt, charged} end
local most = tonumber(ARGV[7])
if most > 0 and charged > most then return {3, attempt, charged} end
redis.call('HSET', KEYS[1], 'state', 'streaming')
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*',
           'type', 'start', 'attempt', attempt, 'worker', ARGV[2], 'prompt_tokens', ARGV[8])
redis.call('EXPIRE', KEYS[2], ARGV[5])
return {1, attempt, charged}
"""
)

# KEYS: request hash. ARGV: token. An attempt handed back unfinished (its worker is stopping)
# no longer owns the request, and is not charged as a failed attempt.
RELEASE = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'owner')
redis.call('HINCRBY', KEYS[1], 'handed_back', 1)
return 1
"""

# KEYS: request hash, output stream, cancel flag. ARGV: token, output maxlen, text, batch number,
# and the text's log probabilities (JSON) for a request that asks for them.
# A batch resent after a lost reply (Redis restarted) is written once: its number is not above
# the last one written. The reply also says whether the user pressed Stop, so a streaming
# answer needs no separate check for it.
DELTA = """
local owner, last = unpack(redis.call('HMGET', KEYS[1], 'owner', 'seq'))
if owner ~= ARGV[1] then return 0 end
if tonumber(ARGV[4]) > (tonumber(last) or 0) then
  if ARGV[5] then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'type', 'delta', 'text', ARGV[3],
      'logprobs', ARGV[5])
  else
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'type', 'delta', 'text', ARGV[3])
  end
  redis.call('HSET', KEYS[1], 'seq', ARGV[4])
end
if redis.call('EXISTS', KEYS[3]) == 1 then return 2 end
return 1
"""

# KEYS: request hash, output stream
# ARGV: token ('' = no attempt), now ms, request ttl, output ttl, output maxlen, state, error,
#       usage, retry after, then the final event's fields as name, value pairs
FINISH = """
local s, ended_by = unpack(redis.call('HMGET', KEYS[1], 'state', 'ended_by'))
if s == 'done' or s == 'failed' or s == 'cancelled' then
  if ARGV[1] ~= '' and ended_by == ARGV[1] then return 1 end
  return 0
end
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return -1 end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', unpack(ARGV, 10))
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('HSET', KEYS[1], 'state', ARGV[6], 'error', ARGV[7], 'usage', ARGV[8],
           'retry_after', ARGV[9], 'updated_ms', ARGV[2], 'ended_by', ARGV[1])
redis.call('HDEL', KEYS[1], 'owner')
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS: request hash, output stream. ARGV: now ms, request ttl, output ttl, output maxlen,
# work stream (the request inspector tells an affinity stream from the shared one)
DISPATCHED = """
local s = redis.call('HGET', KEYS[1], 'state')
if s and s ~= 'queued' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'dispatched', 'updated_ms', ARGV[1], 'dispatched_ms',
           ARGV[1], 'route', ARGV[5])
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'type', 'status', 'state', 'dispatched')
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 1
"""


# KEYS: a conversation's active key. ARGV: the request that should hold it. Deletes the key only
# while it still holds that request.
RELEASE_IF_HELD = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
