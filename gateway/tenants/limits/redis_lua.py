"""The rule of gateway/tenants/limits/ as Lua scripts, each run atomically by Redis on Redis's clock
(TIME), so every gateway process and pod that shares [gateway].redis_url counts against the
same buckets and the same slots.

A key's slots are a sorted set of lease ids scored by their expiry; the process that holds a
lease renews it (RENEW) every concurrency_lease_s / 3 while its request runs and removes it
(ZREM) when the request ends. HEAD drops the expired ones before it counts, so the slots of a
process that died come back within concurrency_lease_s."""

from __future__ import annotations

BUCKETS = """
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function level(key, cap, t)
  local v = redis.call('HMGET', key, 'level', 'ts')
  local l = tonumber(v[1]) or cap
  local ts = tonumber(v[2]) or t
  return math.min(cap, l + math.max(0, t - ts) * cap / 60)
end
local function store(key, l, t)
  redis.call('HSET', key, 'level', tostring(l), 'ts', tostring(t))
  redis.call('EXPIRE', key, 3600)
end
"""

# KEYS: the rpm bucket, the slots; ARGV: rpm (0: none), max_concurrency (0: none), lease_s, lease id.
# Both or neither: a refused request takes no rpm token and no slot.
HEAD = (
    BUCKETS
    + """
local t = now()
local rpm, cap, lease_s = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if cap > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', t)
  if redis.call('ZCARD', KEYS[2]) >= cap then return {0, 'concurrency', '1'} end
end
local r
if rpm > 0 then
  r = level(KEYS[1], rpm, t)
  if r < 1 then return {0, 'rpm', tostring((1 - r) * 60 / rpm)} end
  store(KEYS[1], r - 1, t)
end
if cap > 0 then
  redis.call('ZADD', KEYS[2], t + lease_s, ARGV[4])
  redis.call('EXPIRE', KEYS[2], math.ceil(lease_s) + 60)
end
return {1, '', '0'}
"""
)

# KEYS: the tpm bucket; ARGV: tpm, estimate (at most tpm: checked before).
TOKENS = (
    BUCKETS
    + """
local t = now()
local tpm, estimate = tonumber(ARGV[1]), tonumber(ARGV[2])
local k = level(KEYS[1], tpm, t)
if k < estimate then return {0, tostring((estimate - k) * 60 / tpm)} end
store(KEYS[1], k - estimate, t)
return {1, '0'}
"""
)

# KEYS: the tpm bucket; ARGV: tpm, tokens to give back (negative: to take).
SETTLE = (
    BUCKETS
    + """
local t = now()
local cap, delta = tonumber(ARGV[1]), tonumber(ARGV[2])
store(KEYS[1], math.min(cap, level(KEYS[1], cap, t) + delta), t)
return 1
"""
)

# KEYS: the slots of each lease; ARGV: lease_s, then the lease ids in KEYS' order. Only a live
# lease is renewed: one released meanwhile is gone, and one that expired (dropped by HEAD or not
# yet) has lapsed for good: its slot may already be another request's.
RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local expires = now + tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  local held = redis.call('ZSCORE', key, ARGV[i + 1])
  if held and tonumber(held) > now then
    redis.call('ZADD', key, 'XX', expires, ARGV[i + 1])
    redis.call('EXPIRE', key, math.ceil(tonumber(ARGV[1])) + 60)
  end
end
return #KEYS
"""
