-- Layered token buckets for many requests in one call (the dispatcher batches its intake).
--
-- Integer arithmetic only, so a pure-Python model reproduces every decision exactly: a bucket
-- refilling `refill` units per `window` ms stores its level multiplied by `window`, and then
-- refills by exactly `refill` per millisecond. Costs arrive already scaled.
--
-- KEYS[i]    the bucket hash of request i (fields <name>:l level, <name>:t last update ms)
-- ARGV[1]    now in ms; '' uses Redis TIME (tests inject time through this argument)
-- ARGV[2]    'take': all buckets of a request or none; 'adjust': add signed amounts (refunds)
-- ARGV[3..]  per request: n, then n x (name, capacity, refill per ms, amount), all scaled;
--            n = 0 repeats the previous request's buckets (most of a batch shares a plan and a
--            size: this keeps a batch's arguments, and their parsing, small)
-- Returns    per request: code (0 taken, 1 wait, 2 never fits), wait ms, bucket index (1-based)
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local mode = ARGV[2]
local out = {}
local a = 3
local function fmt(x) return string.format('%.0f', x) end

local n, names, caps, rates, amounts, wanted = 0, {}, {}, {}, {}, {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local given = tonumber(ARGV[a]); a = a + 1
  if given > 0 then
    n, names, caps, rates, amounts, wanted = given, {}, {}, {}, {}, {}
    for b = 1, n do
      names[b] = ARGV[a]; caps[b] = tonumber(ARGV[a + 1])
      rates[b] = tonumber(ARGV[a + 2]); amounts[b] = tonumber(ARGV[a + 3])
      a = a + 4
      wanted[2 * b - 1] = names[b] .. ':l'; wanted[2 * b] = names[b] .. ':t'
    end
  end
  local levels, stamps = {}, {}
  local stored = redis.call('HMGET', key, unpack(wanted))  -- one read for all the buckets
  for b = 1, n do
    local level, t = tonumber(stored[2 * b - 1]), tonumber(stored[2 * b])
    if level == nil or t == nil then level, t = caps[b], now end
    if now > t then
      level = math.min(caps[b], level + (now - t) * rates[b]); t = now
    end
    levels[b] = level; stamps[b] = t
  end
  local code, wait, which = 0, 0, 0
  if mode == 'take' then
    for b = 1, n do
      if amounts[b] > caps[b] then
        if code < 2 then code, wait, which = 2, 0, b end
      elseif levels[b] < amounts[b] and code < 2 then
        local w = math.ceil((amounts[b] - levels[b]) / rates[b])
        if code == 0 or w > wait then code, wait, which = 1, w, b end
      end
    end
  end
  if code == 0 then
    -- Written only when something changes; refilling is lazy, so a refusal needs no write.
    -- The key lives until the slowest of its buckets is full again, counting buckets this
    -- call does not pass (a refund passes only the token buckets): so its lifetime is never
    -- shortened, or the request bucket's state would expire and give the whole burst back.
    local ttl = math.max(1000, redis.call('PTTL', key))
    local fields = {}
    for b = 1, n do
      local level
      if mode == 'take' then level = levels[b] - amounts[b]
      else level = math.min(caps[b], levels[b] + amounts[b]) end
      fields[#fields + 1] = names[b] .. ':l'; fields[#fields + 1] = fmt(level)
      fields[#fields + 1] = names[b] .. ':t'; fields[#fields + 1] = fmt(stamps[b])
      -- A full bucket needs no state: the key lives until the slowest bucket is full again.
      ttl = math.max(ttl, math.ceil((caps[b] - level) / rates[b]) + 1000)
    end
    redis.call('HSET', key, unpack(fields))
    redis.call('PEXPIRE', key, ttl)
  end
  out[#out + 1] = code; out[#out + 1] = wait; out[#out + 1] = which
end
return out
