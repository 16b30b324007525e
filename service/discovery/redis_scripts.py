"""Lua scripts of the Redis store: each runs atomically in Redis, so replicas never race on a decision.

Numbers go in and out as strings ("%.6f"): Redis turns a Lua number reply into an integer, which would cut
timestamps. Lease keys are derived inside the scripts, so the store needs one Redis, not a Redis Cluster.

Resuming a walk (as the memory store does): `P:skip:<target>` maps a client to the last member of the run of
ineligible proxies its last walk found at the front of the LRU, with that member's LRU score, the time the
first of them becomes eligible ('' when none is a candidate) and the candidate set it was found for. The next
walk for that client and target starts after it. Release, renew and a forgiven penalty delete it.
"""

from __future__ import annotations

from service.discovery.redis_share_scripts import COUNTS, LIMITS

# The arguments both acquire scripts take (see their ARGV lists).
_ARGS = r"""
local now, count, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local cooldown, client, target = tonumber(ARGV[4]), ARGV[5], ARGV[6]
local lease_prefix, grace, ignore_cd = ARGV[7], tonumber(ARGV[8]), ARGV[9] == '1'
local holding, rate, burst = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local function fmt(x) return string.format('%.6f', x) end
"""

# Both acquire scripts end the same way: hand out `picked` (proxy keys, LRU order first) with the lease ids
# from ARGV[11...], hold each for this client and target until max(cooldown, ttl) (or longer, when a sticky
# session re-uses a proxy it holds already), and mark it used now.
_HAND_OUT = r"""
if #picked == 0 and full then return share_taken(earliest) end
local hold_until = now + math.max(cooldown, ttl)
local out = {earliest and string.format('%.6f', earliest) or ''}
trim(now)
for i = 1, #picked do
  local key, id = picked[i], ARGV[13 + i]
  redis.call('ZADD', hold, 'GT', string.format('%.6f', hold_until), key)  -- never lowers a longer hold
  local taken = fmt(now + (i - 1) * 1e-6)  -- a microsecond apart: the LRU keeps their order
  redis.call('ZADD', lru, taken, key)
  local lk = lease_prefix .. id
  redis.call('HSET', lk, 'client', client, 'target', target, 'proxy', key,
    'handed', string.format('%.6f', now), 'expires', string.format('%.6f', now + ttl),
    'hold', string.format('%.6f', hold_until), 'released', '0')
  redis.call('PEXPIRE', lk, math.floor((ttl + grace) * 1000))
  redis.call('ZADD', used, 'GT', string.format('%.6f', now + ttl), key)  -- who may report on it
  if redis.call('ZADD', act, fmt(now + ttl), id) == 1 then counted(key, 1, taken) end  -- what it holds
  out[#out + 1] = id
  out[#out + 1] = key
end
-- The key holds other leases' proxies too: its TTL may only grow (a short lease must not drop a long hold).
local keep = math.floor((math.max(cooldown, ttl) + 60) * 1000)
if redis.call('PTTL', hold) < keep then redis.call('PEXPIRE', hold, keep) end
if #picked > 0 then
  local used_keep = math.floor((ttl + grace) * 1000)
  if redis.call('PTTL', used) < used_keep then redis.call('PEXPIRE', used, used_keep) end
  local act_keep = math.floor((ttl + 60) * 1000)
  if redis.call('PTTL', act) < act_keep then redis.call('PEXPIRE', act, act_keep) end
  keep_counts()
  if rate then
    local after = tat + #picked / rate
    redis.call('SET', ratekey, fmt(after), 'PX', math.floor((after - now + 60) * 1000))
  end
end
return out
"""

# KEYS: hold zset (client|target), penalty zset (target), lru zset, used zset (client: proxy -> lease end),
#       act zset (client: lease id -> end), rate key (client), share set ('' when the pool is the candidates),
#       banned-by zset (client: proxy -> end of the penalty its report set), then the client's counts:
#       pcnt, pin, pnum, ptake (redis_share_scripts.COUNTS)
# ARGV: now, count, ttl, cooldown, client, target, lease key prefix, grace, ignore_cooldown, holding, rate,
#       burst, n_ids, ids..., candidates...
ACQUIRE = (
    r"""
local hold, pen, lru, used, act, ratekey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local share_key, banby = KEYS[7] ~= '' and KEYS[7], KEYS[8]
local pcnt, pin, pnum, ptake = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
if share_key and redis.call('PEXPIRE', share_key, 600000) == 0 then return {'nocand'} end  -- refreshed at use
"""
    + _ARGS
    + r"""
local nids = tonumber(ARGV[13])
local first = 14 + nids
local listed = {unpack(ARGV, first, #ARGV)}
local cand = nil
local function in_cand(proxy)
  if cand == nil then
    cand = {}
    for i = 1, #listed do cand[listed[i]] = true end
  end
  return cand[proxy] == true
end
local count_key, pool_list = share_key, listed
"""
    + LIMITS
    + r"""
if full then
  local kept = {}
  for i = 1, #listed do if is_mine(listed[i]) then kept[#kept + 1] = listed[i] end end
  full = #kept < #listed  -- the share keeps other candidates away (else: they are all its own)
  listed = kept
end
local eligible, earliest = judge(listed)
local picked = {}
take(eligible, picked)
"""
    + _HAND_OUT
)

# A sticky session's lease in one round trip: the session's proxy, its penalty for the target and its place
# in the pool; when all allow, the session's renewal (BIND_SESSION with the proxy unchanged), then ACQUIRE
# on that proxy alone. Returns {'unbound'}, {'bound', proxy, penalty until or ''} (outside the pool or
# penalised: nothing done), {'nocand'}, or ACQUIRE's answer.
# KEYS: session hash, then ACQUIRE's first eight, the pool's set ('' when the pool is listed in ARGV), then
#       the client's counts (pcnt, pin, pnum, ptake)
# ARGV: ACQUIRE's up to the ids, then idle until, the session keys' lifetime (ms), client|session, the
#       sessions-by-proxy key prefix, the pool's members (when listed)
STICKY = (
    r"""
local sess, hold, pen, lru, used, act, ratekey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local share_key, banby, pool_key = KEYS[8] ~= '' and KEYS[8], KEYS[9], KEYS[10] ~= '' and KEYS[10]
local pcnt, pin, pnum, ptake = KEYS[11], KEYS[12], KEYS[13], KEYS[14]
if share_key and redis.call('PEXPIRE', share_key, 600000) == 0 then return {'nocand'} end  -- refreshed at use
if pool_key and redis.call('PEXPIRE', pool_key, 600000) == 0 then return {'nocand'} end
"""
    + _ARGS
    + r"""
local b = 14 + tonumber(ARGV[13])
local bound = redis.call('HMGET', sess, 'proxy', 'until')
if not bound[1] or not bound[2] or tonumber(bound[2]) <= now then return {'unbound'} end
local proxy = bound[1]
local penalty = redis.call('ZSCORE', pen, proxy)
local in_pool = false
if pool_key then
  in_pool = redis.call('SISMEMBER', pool_key, proxy) == 1
else
  for i = b + 4, #ARGV do if ARGV[i] == proxy then in_pool = true break end end
end
if not in_pool or (tonumber(penalty) or 0) > now then return {'bound', proxy, penalty or ''} end
redis.call('HSET', sess, 'until', ARGV[b])
redis.call('PEXPIRE', sess, ARGV[b + 1])
local sessby = ARGV[b + 3] .. proxy
redis.call('ZADD', sessby, ARGV[b], ARGV[b + 2])
redis.call('ZREMRANGEBYSCORE', sessby, '-inf', ARGV[1])
redis.call('PEXPIRE', sessby, ARGV[b + 1])
local listed = {proxy}
local function in_cand(p) return p == proxy end
local count_key, pool_list = share_key, listed
"""
    + LIMITS
    + r"""
if full then
  full = not is_mine(proxy)  -- the share keeps its proxy away (else: it is its own)
  if full then listed = {} end
end
local eligible, earliest = judge(listed)
local picked = {}
take(eligible, picked)
"""
    + _HAND_OUT
)

# KEYS: lease key; ARGV: now, cooldown, hold key prefix, skip key prefix, act key prefix, lease id, lease key
#       prefix, pcnt key prefix, pin key prefix, pnum key prefix, ptake key prefix
RELEASE = (
    r"""
local f = redis.call('HMGET', KEYS[1], 'client', 'target', 'proxy', 'handed', 'expires', 'hold', 'released')
if not f[1] then return '' end
local now, cooldown = tonumber(ARGV[1]), tonumber(ARGV[2])
if f[7] == '1' or tonumber(f[5]) <= now then return '' end
local hold = ARGV[3] .. f[1] .. '|' .. f[2]
local cur = redis.call('ZSCORE', hold, f[3])
if cur and tonumber(cur) == tonumber(f[6]) then
  redis.call('ZADD', hold, string.format('%.6f', math.max(tonumber(f[4]) + cooldown, now)), f[3])
  redis.call('HDEL', ARGV[4] .. f[2], f[1])
end
redis.call('HSET', KEYS[1], 'released', '1', 'expires', string.format('%.6f', now))
local act, pcnt, pin, lease_prefix = ARGV[5] .. f[1], ARGV[8] .. f[1], ARGV[9] .. f[1], ARGV[7]
local pnum, ptake = ARGV[10] .. f[1], ARGV[11] .. f[1]
local function fmt(x) return string.format('%.6f', x) end
"""
    + COUNTS
    + r"""
if redis.call('ZREM', act, ARGV[6]) == 1 then
  counted(f[3], -1)
  keep_counts()
end
return 'ok'
"""
)

# KEYS: lease key; ARGV: now, ttl, cooldown, hold key prefix, grace, skip key prefix, used key prefix,
#       act key prefix, lease id, pcnt key prefix, pin key prefix, pnum key prefix, ptake key prefix
# The lease ends at now + ttl; its hold follows when it is this lease's (or shorter), as in the memory store.
RENEW = r"""
local f = redis.call('HMGET', KEYS[1], 'client', 'target', 'proxy', 'handed', 'expires', 'hold', 'released')
if not f[1] then return '' end
local now, ttl, cooldown, grace = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
if f[7] == '1' or tonumber(f[5]) <= now then return '' end
local untl = now + ttl
local hold = ARGV[4] .. f[1] .. '|' .. f[2]
local cur = tonumber(redis.call('ZSCORE', hold, f[3]))
if cur == nil or cur == tonumber(f[6]) or cur < untl then
  local held = math.max(tonumber(f[4]) + cooldown, untl)
  redis.call('ZADD', hold, string.format('%.6f', held), f[3])
  redis.call('HSET', KEYS[1], 'hold', string.format('%.6f', held))
  redis.call('HDEL', ARGV[6] .. f[2], f[1])
  local keep = math.floor((held - now + 60) * 1000)
  if redis.call('PTTL', hold) < keep then redis.call('PEXPIRE', hold, keep) end
end
redis.call('HSET', KEYS[1], 'expires', string.format('%.6f', untl))
redis.call('PEXPIRE', KEYS[1], math.floor((ttl + grace) * 1000))
local used = ARGV[7] .. f[1]
redis.call('ZADD', used, 'GT', string.format('%.6f', untl), f[3])
local act = ARGV[8] .. f[1]
redis.call('ZADD', act, 'XX', string.format('%.6f', untl), ARGV[9])
local act_keep = math.floor((ttl + 60) * 1000)
if redis.call('PTTL', act) < act_keep then
  redis.call('PEXPIRE', act, act_keep)
  for i = 10, 13 do redis.call('PEXPIRE', ARGV[i] .. f[1], act_keep) end  -- the counts, as `act` (COUNTS)
end
local used_keep = math.floor((ttl + grace) * 1000)
if redis.call('PTTL', used) < used_keep then redis.call('PEXPIRE', used, used_keep) end
return 'ok'
"""

# KEYS: penalty zset (target), strikes hash (proxy), lease hash ('': no lease checked)
# ARGV: proxy, target, now, base, cap, fraction, keep_seconds, banned-by key prefix
# The reporter holds the proxy (for its fair share, in requests for that target) while the penalty runs:
# `P:banby:<client>|<target>` proxy -> end.
# A lease's ban counts once: {'dup'} when it was counted already (or the lease is gone), nothing changed.
PENALISE = r"""
if KEYS[3] ~= '' then
  if redis.call('HEXISTS', KEYS[3], 'client') == 0 then return {'dup'} end
  if redis.call('HSETNX', KEYS[3], 'banned', '1') == 0 then return {'dup'} end
end
local proxy, target, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local base, cap, fraction = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local strikes = redis.call('HINCRBY', KEYS[2], target, 1)
local untl = now + fraction * math.min(cap, base * 2 ^ math.min(strikes - 1, 40))
local cur = tonumber(redis.call('ZSCORE', KEYS[1], proxy))
if cur and cur > untl then untl = cur end
redis.call('ZADD', KEYS[1], string.format('%.6f', untl), proxy)
redis.call('PEXPIRE', KEYS[1], math.floor((cap + 60) * 1000))
redis.call('PEXPIRE', KEYS[2], math.floor(tonumber(ARGV[7]) * 1000))
if KEYS[3] ~= '' then
  local by = ARGV[8] .. redis.call('HGET', KEYS[3], 'client') .. '|' .. target
  redis.call('ZADD', by, 'GT', string.format('%.6f', untl), proxy)
  redis.call('ZREMRANGEBYSCORE', by, '-inf', string.format('%.6f', now))
  local keep = math.floor((untl - now + 60) * 1000)
  if redis.call('PTTL', by) < keep then redis.call('PEXPIRE', by, keep) end
end
return {string.format('%.6f', untl), tostring(strikes)}
"""

# KEYS: session hash, the proxy's sessions zset (client|session -> idle until); ARGV: proxy, idle until,
#       key lifetime (ms), client|session, sessions zset key prefix, now. A session moved to another proxy
#       leaves the old proxy's zset; ended sessions are trimmed from the new one's.
BIND_SESSION = r"""
local old = redis.call('HGET', KEYS[1], 'proxy')
if old and old ~= ARGV[1] then redis.call('ZREM', ARGV[5] .. old, ARGV[4]) end
redis.call('HSET', KEYS[1], 'proxy', ARGV[1], 'until', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[6])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 'ok'
"""

# KEYS: penalty zset (target), strikes hash (proxy), skip hash (target); ARGV: proxy, target, now
# A running penalty stays (it ends by itself); one that ran out is forgotten with its strikes.
FORGIVE = r"""
local cur = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if cur and cur > tonumber(ARGV[3]) then return 'running' end
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then redis.call('DEL', KEYS[3]) end
redis.call('HDEL', KEYS[2], ARGV[2])
return 'ok'
"""

# KEYS: error votes zset (proxy: client -> when); ARGV: client, now, window
# Returns {distinct voters in the window, 1 if this client's vote is new in it}.
ERROR_VOTE = r"""
local now, window = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.6f', now - window))
local new = redis.call('ZSCORE', KEYS[1], ARGV[1]) == false
redis.call('ZADD', KEYS[1], string.format('%.6f', now), ARGV[1])
redis.call('PEXPIRE', KEYS[1], math.floor((window + 60) * 1000))
return {redis.call('ZCARD', KEYS[1]), new and 1 or 0}
"""

# KEYS: the client's counter for one window; ARGV: its lifetime (ms). Returns the count, this one included.
COUNT_REPORT = r"""
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n
"""

# The same decision over a candidate set stored in Redis (named by its members, shared by replicas, never
# changed once named: redis_sets.py),
# walking the LRU zset from its oldest member (or after the ineligible run the last walk for this client and
# target found) in chunks that grow from 16, so a lease costs O(count) and not O(fleet) in the common case. A
# client at its share that holds few proxies gets them sorted; one that holds many (an eighth of the LRU or
# more) walks the LRU for them, as the memory store does: neither reads its leases.
# KEYS: hold zset, penalty zset, lru zset, used zset, candidate set, skip hash (target), act zset, rate key,
#       share set ('' when the pool is the candidates), banned-by zset, the client's counts (pcnt, pin, pnum,
#       ptake)
# ARGV: as ACQUIRE's, without the candidates
ACQUIRE_FROM_SET = (
    r"""
local hold, pen, lru, used, cand, skips = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local act, ratekey, share_key, banby = KEYS[7], KEYS[8], KEYS[9] ~= '' and KEYS[9], KEYS[10]
local pcnt, pin, pnum, ptake = KEYS[11], KEYS[12], KEYS[13], KEYS[14]
if redis.call('PEXPIRE', cand, 600000) == 0 then return {'nocand'} end  -- gone; else kept 10 min from its use
if share_key and redis.call('PEXPIRE', share_key, 600000) == 0 then return {'nocand'} end
local function in_cand(proxy) return redis.call('SISMEMBER', cand, proxy) == 1 end
local count_key, pool_list = share_key or cand, {}
"""
    + _ARGS
    + LIMITS
    + r"""
-- Of `members`, which the client holds (is_mine for each, in a few calls).
local function mine_of(members)
  local leased = redis.call('HMGET', pcnt, unpack(members))
  local bans = live_bans().ends
  local shared = share_key and redis.call('SMISMEMBER', share_key, unpack(members))
  local out = {}
  for i = 1, #members do
    out[i] = (leased[i] ~= false or bans[members[i]] ~= nil) and (not shared or shared[i] == 1)
  end
  return out
end
-- The share keeps some candidate away (one it does not hold): a 429, not a 503.
local function kept_away()
  if not share_key then return held_now < redis.call('SCARD', cand) end
  local all = redis.call('SMEMBERS', cand)
  for s = 1, #all, 1000 do
    local part = {unpack(all, s, math.min(s + 999, #all))}
    local m = mine_of(part)
    for i = 1, #part do if not m[i] then return true end end
  end
  return false
end
-- Where a walk for the proxies it holds starts: none is less recently used than the client's oldest take
-- of one it still leases (`ptake`), or than the least recently used proxy it holds by a ban.
local function held_from()
  local from = nil
  local first = redis.call('ZRANGE', ptake, 0, 0, 'WITHSCORES')
  if #first > 0 then from = tonumber(first[2]) end
  local bans = live_bans().keys
  for s = 1, #bans, 1000 do
    local l = redis.call('ZMSCORE', lru, unpack(bans, s, math.min(s + 999, #bans)))
    for i = 1, #l do
      local v = tonumber(l[i]) or -1
      if from == nil or v < from then from = v end
    end
  end
  if from == nil then return 0 end
  return redis.call('ZCOUNT', lru, '-inf', '(' .. fmt(from))
end
local picked, earliest = {}, nil
if full and held_now * 8 < redis.call('ZCARD', lru) then  -- few held: sort them, no walk
  local kept, seen = {}, {}
  local held = redis.call('HKEYS', pcnt)
  local bans = live_bans().keys
  for i = 1, #bans do held[#held + 1] = bans[i] end
  for i = 1, #held do
    local key = held[i]
    if not seen[key] and in_share(key) and in_cand(key) then kept[#kept + 1] = key end
    seen[key] = true
  end
  full = #kept < redis.call('SCARD', cand)  -- the share keeps other candidates away
  local eligible
  eligible, earliest = judge(kept)
  take(eligible, picked)
else
local only_held = full  -- many held: the walk passes the others by, from the least recently used of them
local pos, run_until = only_held and held_from() or 0, nil
local saved = (not (ignore_cd or full)) and redis.call('HGET', skips, client)
if saved then
  local r = cjson.decode(saved)  -- {member, its score, eligible-from or '', candidate set}
  if r[4] == cand and (r[3] == '' or tonumber(r[3]) > now) then
    if redis.call('ZSCORE', lru, r[1]) == r[2] then
      pos = redis.call('ZRANK', lru, r[1]) + 1
    else  -- handed out since (to someone else): all older than it are still in the run
      pos = redis.call('ZCOUNT', lru, '-inf', '(' .. r[2])
    end
    if r[3] ~= '' then earliest, run_until = tonumber(r[3]), tonumber(r[3]) end
  end
end
local skipped, last, last_score, size = 0, nil, nil, 16
while #picked < count and room ~= 0 do
  local chunk = redis.call('ZRANGE', lru, pos, pos + size - 1, 'WITHSCORES')
  local n = #chunk / 2
  if n == 0 then break end
  pos = pos + n
  local members = {}
  for i = 1, n do members[i] = chunk[2 * i - 1] end
  local member = redis.call('SMISMEMBER', cand, unpack(members))
  local h = ignore_cd and {} or redis.call('ZMSCORE', hold, unpack(members))
  local p = redis.call('ZMSCORE', pen, unpack(members))
  local held = only_held and mine_of(members)
  for i = 1, n do
    local at = nil  -- nil: not a candidate (or, at its share, not one it holds)
    if member[i] == 1 and (not held or held[i]) then
      at = tonumber(p[i]) or 0
      if not ignore_cd then at = math.max(at, tonumber(h[i]) or 0) end
    end
    if at and at <= now then
      if #picked < count and room ~= 0 then
        picked[#picked + 1] = members[i]
        if room and not is_mine(members[i]) then room = room - 1 end
      end
    else
      if at and (earliest == nil or at < earliest) then earliest = at end
      if #picked == 0 then
        skipped, last, last_score = skipped + 1, members[i], chunk[2 * i]
        if at and (run_until == nil or at < run_until) then run_until = at end
      end
    end
  end
  if n < size then break end
  size = math.min(size * 2, 1024)
end
if skipped >= 16 and not (ignore_cd or full) then
  local untl = run_until and string.format('%.6f', run_until) or ''
  redis.call('HSET', skips, client, cjson.encode({last, last_score, untl, cand}))
  local keep = math.floor(((run_until or now + 600) - now + 60) * 1000)
  if redis.call('PTTL', skips) < keep then redis.call('PEXPIRE', skips, keep) end
end
if full and #picked == 0 then full = kept_away() end
end
"""
    + _HAND_OUT
)
