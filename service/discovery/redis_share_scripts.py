"""Lua fragments of the Redis store's fair share (fair_share.py's rules): the client's share counts, kept with
its leases, and the limits an acquire script applies with them. redis_scripts.py puts them into its scripts;
they expect the locals each script defines (listed above each fragment).
"""

from __future__ import annotations

# The client's share counts (as the memory store's `MemoryHoldings` keeps them): `pcnt` (proxy -> the
# client's running leases on it, one for each entry of `act` naming it), `pnum` (their sum: as many as `act`
# has entries), `pin` (a pool's set key -> how many proxies of `pcnt` are in that set, for the sets its
# shares were counted over) and `ptake` (proxy of `pcnt` -> when the client last took it: no proxy it
# leases is less recently used than the least of these). Every change to `act` goes through them, so no
# request reads the client's leases to count them (issue 20: at 30,000 leases that read cost 5 ms of Redis
# a lease). They live as long as `act`. Expects `act`, `pcnt`, `pnum`, `pin`, `ptake`, `lease_prefix` and
# `fmt`.
COUNTS = r"""
local PIN_SETS = 8  -- pools counted per client; past it the counts start again (a pass over `pcnt` each)
-- A lease of the client on `proxy` began (+1, taken `at`: its LRU score) or ended (-1); its first and last
-- change the pools' counts.
local function counted(proxy, change, at)
  redis.call('INCRBY', pnum, change)
  local n = redis.call('HINCRBY', pcnt, proxy, change)
  if at then redis.call('ZADD', ptake, at, proxy) end
  if n <= 0 then
    redis.call('HDEL', pcnt, proxy)
    redis.call('ZREM', ptake, proxy)
  end
  if (change > 0 and n == 1) or (change < 0 and n <= 0) then
    local sets = redis.call('HKEYS', pin)
    for i = 1, #sets do
      if redis.call('EXISTS', sets[i]) == 0 then  -- a set that expired: counted again on its next use
        redis.call('HDEL', pin, sets[i])
      elseif redis.call('SISMEMBER', sets[i], proxy) == 1 then
        redis.call('HINCRBY', pin, sets[i], change)
      end
    end
  end
end
-- The counts expire with `act` (its lifetime set by the callers); no lease left, nothing to count.
local function keep_counts()
  local left = redis.call('PTTL', act)
  if left > 0 then
    for _, key in ipairs({pcnt, pnum, pin, ptake}) do redis.call('PEXPIRE', key, left) end
  else
    redis.call('DEL', pcnt, pnum, pin, ptake)
  end
end
-- The leases that ended by `at` leave `act` and the counts: the cost is what ended, not what is held.
local function trim(at)
  local gone = redis.call('ZRANGEBYSCORE', act, '-inf', fmt(at))
  if #gone == 0 then return end
  for i = 1, #gone do
    local proxy = redis.call('HGET', lease_prefix .. gone[i], 'proxy')  -- kept a grace past its end
    if proxy then counted(proxy, -1) end
  end
  redis.call('ZREMRANGEBYSCORE', act, '-inf', fmt(at))
  keep_counts()
end
-- The counts are counted again from `act` when they do not add up to its entries: a lease whose hash was
-- lost (evicted, deleted by hand) could not be uncounted when it ended, and would have held its proxy for
-- as long as the client kept leasing. One pass over its leases, once; a lease with no hash leaves `act`.
local function recount()
  if (tonumber(redis.call('GET', pnum)) or 0) == redis.call('ZCARD', act) then return end
  redis.call('DEL', pcnt, pnum, pin, ptake)
  local ids = redis.call('ZRANGE', act, 0, -1)
  for i = 1, #ids do
    local f = redis.call('HMGET', lease_prefix .. ids[i], 'proxy', 'handed')
    if f[1] then
      redis.call('HINCRBY', pcnt, f[1], 1)
      redis.call('ZADD', ptake, 'GT', f[2] or '0', f[1])  -- its hand-out: no later than its LRU score
    else
      redis.call('ZREM', act, ids[i])
    end
  end
  redis.call('SET', pnum, redis.call('ZCARD', act))
  keep_counts()
end
"""

# The fair share (service/discovery/fair_share.py, the same rules): the rate bucket first (an empty one
# answers {'limited', 'lease_rate', when one more fits}), then how many distinct proxies of the share pool
# the client holds (`held_now`, from the counts) and the `room` left. When the share is taken (`full`), only
# the proxies it holds (`is_mine`) may be handed out. Expects COUNTS's locals, `banby` (the penalties
# its reports set: proxy -> end), `ratekey`, `share_key` (a set, or false: the pool is the candidates),
# `count_key` (the pool's set, or false: the pool is `pool_list`, a few proxies) and `in_cand(proxy)`.
LIMITS = (
    COUNTS
    + r"""
local function in_share(proxy)
  if share_key then return redis.call('SISMEMBER', share_key, proxy) == 1 end
  return in_cand(proxy)
end
-- The running penalties the client's reports set for this target, read once a request (no script sets one):
-- {keys = the proxies, ends = proxy -> end}.
local bans_now = nil
local function live_bans()
  if bans_now == nil then
    bans_now = {keys = {}, ends = {}}
    local r = redis.call('ZRANGEBYSCORE', banby, '(' .. fmt(now), '+inf', 'WITHSCORES')
    for i = 1, #r, 2 do
      bans_now.keys[#bans_now.keys + 1] = r[i]
      bans_now.ends[r[i]] = tonumber(r[i + 1])
    end
  end
  return bans_now
end
-- Held, for this request: a lease on it (for any target), or a running penalty its report set for this one.
local function holds(proxy)
  if redis.call('HEXISTS', pcnt, proxy) == 1 then return true end
  return live_bans().ends[proxy] ~= nil
end
local function is_mine(proxy) return in_share(proxy) and holds(proxy) end
-- How many proxies of the pool it holds by a lease: kept in `pin` for a pool's set (counted from `pcnt`
-- on its first use), counted over `pool_list` otherwise.
local function leased_in_pool()
  local c = 0
  if not count_key then
    for i = 1, #pool_list do c = c + redis.call('HEXISTS', pcnt, pool_list[i]) end
    return c
  end
  local n = redis.call('HGET', pin, count_key)
  if n then return tonumber(n) end
  local held = redis.call('HKEYS', pcnt)
  for s = 1, #held, 4000 do
    local m = redis.call('SMISMEMBER', count_key, unpack(held, s, math.min(s + 3999, #held)))
    for i = 1, #m do c = c + m[i] end
  end
  if redis.call('HLEN', pin) >= PIN_SETS then redis.call('DEL', pin) end
  redis.call('HSET', pin, count_key, c)
  keep_counts()
  return c
end
local tat = nil
if rate then
  tat = tonumber(redis.call('GET', ratekey)) or 0
  if tat < now then tat = now end
  local fits = math.floor(burst - (tat - now) * rate + 1e-9)
  if fits < 1 then
    return {'limited', 'lease_rate', fmt(now + math.max(tat - now - (burst - 1) / rate, 0))}
  end
  if fits < count then count = fits end
end
local room, full, held_now = nil, false, 0
if holding then
  trim(now)
  recount()
  -- At most this many distinct proxies are held (one per proxy leased, one per ban): far enough under the
  -- limit, this request cannot reach it, and nothing need be counted.
  local most = redis.call('HLEN', pcnt) + redis.call('ZCOUNT', banby, '(' .. fmt(now), '+inf')
  if most + count <= holding then holding = nil end
end
if holding then
  held_now = leased_in_pool()
  local bans = live_bans().keys
  for i = 1, #bans do
    if redis.call('HEXISTS', pcnt, bans[i]) == 0 and in_share(bans[i]) then held_now = held_now + 1 end
  end
  room = holding - held_now
  if room <= 0 then room, full = nil, true end
end
-- What is eligible among `list` (proxy keys), least recently used first, and the earliest a skipped one is.
local function judge(list)
  local eligible, first = {}, nil
  local CHUNK = 4000
  for s = 1, #list, CHUNK do
    local part = {unpack(list, s, math.min(s + CHUNK - 1, #list))}
    local h = redis.call('ZMSCORE', hold, unpack(part))
    local p = redis.call('ZMSCORE', pen, unpack(part))
    local l = redis.call('ZMSCORE', lru, unpack(part))
    for i = 1, #part do
      local at = tonumber(p[i]) or 0
      if not ignore_cd then at = math.max(at, tonumber(h[i]) or 0) end
      if at <= now then
        eligible[#eligible + 1] = {tonumber(l[i]) or -1, part[i]}
      elseif first == nil or at < first then
        first = at
      end
    end
  end
  table.sort(eligible, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  return eligible, first
end
-- Take from `eligible` in order while count and room allow.
local function take(eligible, picked)
  for i = 1, #eligible do
    if #picked >= count or room == 0 then break end
    local key = eligible[i][2]
    picked[#picked + 1] = key
    if room and not is_mine(key) then room = room - 1 end
  end
end
-- Nothing handed out because the share is taken: when the first of its proxies frees (or turns eligible).
-- Each proxy is freed by its last lease's end (or its ban's): this reads the client's leases, once, for
-- the 429's Retry-After only.
local function share_taken(earliest)
  local ends = {}
  local ids = redis.call('ZRANGE', act, 0, -1, 'WITHSCORES')
  for i = 1, #ids, 2 do
    local proxy = redis.call('HGET', lease_prefix .. ids[i], 'proxy')
    if proxy and in_share(proxy) then
      local e = tonumber(ids[i + 1])
      if ends[proxy] == nil or ends[proxy] < e then ends[proxy] = e end
    end
  end
  for proxy, e in pairs(live_bans().ends) do
    if in_share(proxy) and (ends[proxy] == nil or ends[proxy] < e) then ends[proxy] = e end
  end
  local untl = nil
  for _, e in pairs(ends) do if untl == nil or e < untl then untl = e end end
  if earliest and (untl == nil or earliest < untl) then untl = earliest end
  return {'limited', 'lease_share', fmt(untl)}
end
"""
)
