"""The hot tier's Lua scripts (apps/chat/prompt/hot.py): each reads or writes a conversation's
hash and list together, so no reader sees one without the other."""

from __future__ import annotations

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
