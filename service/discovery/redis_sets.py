"""The candidate sets a Redis store's scripts walk: uploaded once per distinct set, a new one as its change.

A lease over more than `SMALL_SET` candidates names a set in Redis instead of listing them (the scripts'
`cand`, and a sticky session's pool). The healthy set changes with every probe that flips a proxy, and
each change is a new set: uploaded whole, 10,000 members cost the service about 24 ms of CPU (sort, hash,
pack 20,000 arguments: `tests/bench/bench_share_counts.py`, "share 1, churn"), and every request that met
the new set waited for it. Now a new set is built in Redis from one this process uploaded before, by the
difference (`PATCH`: copy, add, remove, in one script), when the difference is small; whole otherwise
(the first set, a large change, or a base that is gone from Redis).

Keys are `P:cand:<process>:<n>`, one per set this process uploaded (a set is never changed once named, so
the scripts' resume record, which names the set it was found for, stays true). A set stays in Redis
CANDIDATE_SET_TTL_MS after its last use (the scripts restore that TTL at each use); a set a newer one was
built from, or one this process no longer remembers, is retired to RETIRED_SET_TTL_MS, which its next use
restores, so the sets of a churning fleet leave Redis within seconds instead of ten minutes. The process
remembers its RECENT_SETS latest sets (a set of 10,000 keys is about 0.5 MiB of the service's memory: it
kept 64 of them, and every key it ever uploaded).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from service.discovery.redis_pipe import StoreConnectionError, StoreTimeoutError

CANDIDATE_SET_TTL_MS = 600_000  # the scripts' own PEXPIRE at each use (redis_scripts.py)
RETIRED_SET_TTL_MS = 10_000  # a superseded set, unless a request uses it again
RECENT_SETS = 8  # sets this process remembers, and may build a new one from
PATCH_AT_MOST = 1000  # members added and removed: past this (or a quarter of the set) a set is uploaded whole
CHUNK = 1000  # members a command

# KEYS: base set, new set, lru zset, a set to retire as well ('' none)
# ARGV: the new set's ttl (ms), a retired set's (ms), how many are added, the added..., the removed...
# 0: the base is gone (nothing done); 1: the new set is the base's members with the change.
PATCH = r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('SUNIONSTORE', KEYS[2], KEYS[1])
local added, last = tonumber(ARGV[3]), #ARGV
for i = 4, 3 + added, 1000 do
  local j = math.min(i + 999, 3 + added)
  redis.call('SADD', KEYS[2], unpack(ARGV, i, j))
  local scores = {}
  for k = i, j do scores[#scores + 1] = 0; scores[#scores + 1] = ARGV[k] end
  redis.call('ZADD', KEYS[3], 'NX', unpack(scores))  -- never used = oldest, as a whole upload does
end
for i = 4 + added, last, 1000 do
  redis.call('SREM', KEYS[2], unpack(ARGV, i, math.min(i + 999, last)))
end
redis.call('PEXPIRE', KEYS[2], ARGV[1])
local retired = tonumber(ARGV[2])
for _, old in ipairs({KEYS[1], KEYS[4]}) do
  if old ~= '' and redis.call('PTTL', old) > retired then redis.call('PEXPIRE', old, retired) end
end
return 1
"""

# KEYS: a set to retire; ARGV: its ttl (ms)
RETIRE = r"""
if redis.call('PTTL', KEYS[1]) > tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return 0
"""


class CandidateSets:
    """This process's candidate sets in Redis: `key(members)` names one holding exactly `members`."""

    def __init__(self, client: aioredis.Redis, *, prefix: str) -> None:
        self._r = client
        self._p = prefix
        self._patch = client.register_script(PATCH)
        self._retire = client.register_script(RETIRE)
        self._process = uuid.uuid4().hex[:12]
        self._serial = itertools.count(1)
        self._keys: dict[frozenset[str], str] = {}  # the RECENT_SETS sets last used, the latest last
        self._uploaded: set[str] = set()  # of their keys, those in Redis (as far as this process knows)
        self._uploading: dict[str, asyncio.Future[None]] = {}
        self.patched = self.whole = 0  # uploads of each kind, for tests and benches

    async def key(self, members: frozenset[str]) -> str:
        """The key of a set holding `members`, uploaded first if this process has not (one upload per set
        however many requests arrive while it runs)."""
        key = self._keys.pop(members, None) or self._name()
        self._keys[members] = key  # the latest used last: the least recently used is forgotten first
        if key not in self._uploaded:
            upload = self._uploading.get(key)
            if upload is None:
                upload = self._uploading[key] = asyncio.ensure_future(self._upload(key, members))
                upload.add_done_callback(lambda _: self._uploading.pop(key, None))
            await asyncio.shield(upload)
            if key in self._keys.values():  # not forgotten meanwhile
                self._uploaded.add(key)
        return key

    def gone(self, *keys: str) -> None:
        """A script found these keys missing (expired in Redis): the next use uploads them again."""
        self._uploaded.difference_update(keys)

    def remembered(self) -> int:
        return len(self._keys)

    def _name(self) -> str:
        return f"{self._p}:cand:{self._process}:{next(self._serial)}"

    def _forget_oldest(self) -> str:
        """Forget the least recently used set past RECENT_SETS (its key, to retire in Redis; '' none)."""
        if len(self._keys) <= RECENT_SETS:
            return ""
        oldest = next(iter(self._keys))
        key = self._keys.pop(oldest)
        self._uploaded.discard(key)
        return key

    def _base(self, members: frozenset[str], own: str) -> tuple[str, list[str], list[str]] | None:
        """The uploaded set nearest `members` that a small change turns into it: (its key, added,
        removed); None when there is none (the most recently used sets first)."""
        most = min(PATCH_AT_MOST, len(members) // 4)
        for base, key in reversed(self._keys.items()):
            if key == own or key not in self._uploaded or abs(len(base) - len(members)) > most:
                continue
            added = members - base
            if len(added) > most:
                continue
            removed = base - members
            if len(added) + len(removed) <= most:
                return key, sorted(added), sorted(removed)
        return None

    async def _upload(self, key: str, members: frozenset[str]) -> None:
        retire = self._forget_oldest()
        try:
            base = self._base(members, key)
            if base is not None:
                base_key, added, removed = base
                args = [str(CANDIDATE_SET_TTL_MS), str(RETIRED_SET_TTL_MS), str(len(added)), *added, *removed]
                if await self._patch(keys=[base_key, key, f"{self._p}:lru", retire], args=args):
                    self.patched += 1
                    return
                self._uploaded.discard(base_key)  # gone from Redis: the set goes whole
            await self._whole(key, members)
            if retire:
                await self._retire(keys=[retire], args=[str(RETIRED_SET_TTL_MS)])
            self.whole += 1
        except RedisConnectionError as exc:  # part of a lease: the API's 503, not a 500
            raise StoreConnectionError(f"uploading a candidate set: {exc}") from exc
        except RedisTimeoutError as exc:
            raise StoreTimeoutError(f"uploading a candidate set: {exc}") from exc

    async def _whole(self, key: str, members: frozenset[str]) -> None:
        # Built under a temporary name and renamed, so a script never sees half a set.
        tmp = f"{key}:tmp:{uuid.uuid4().hex}"
        ordered = list(members)
        async with self._r.pipeline(transaction=False) as pipe:
            for start in range(0, len(ordered), CHUNK):
                pipe.sadd(tmp, *ordered[start : start + CHUNK])
            pipe.zadd(f"{self._p}:lru", dict.fromkeys(ordered, 0), nx=True)  # never used = oldest
            pipe.rename(tmp, key)
            pipe.pexpire(key, CANDIDATE_SET_TTL_MS)
            await pipe.execute()
