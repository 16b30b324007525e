"""The candidate sets a Redis store's scripts walk: uploaded once per distinct set, a new one as its change.

A lease over more than `SMALL_SET` candidates names a set in Redis instead of listing them (the scripts'
`cand`, and a sticky session's pool). The healthy set changes with every probe that flips a proxy, and
each change is a new set: uploaded whole, 10,000 members cost the service about 24 ms of CPU (sort, hash,
pack 20,000 arguments: `tests/bench/bench_share_counts.py`, "share 1, churn"), and every request that met
the new set waited for it. Now a new set is built in Redis from one this process uploaded before, by the
difference (`PATCH`: copy, add, remove, in one script), when the difference is small; whole otherwise
(the first set, a large change, or a base that is gone from Redis).

Keys are `P:cand:<digest>`, named by their members, so every replica names a set alike and shares it (and
the scripts' resume record, which names the set it was found for, holds across replicas). The digest is
the sum of each member's keyed hash (blake2b, 160 bits, keyed by `P:cand-salt`, which the first replica to
need it sets in Redis): a set's digest is its base's plus the change's, with no sort of the set. A set is
never changed once named. A set stays in Redis CANDIDATE_SET_TTL_MS after its last use (the scripts
restore that TTL at each use); a set a newer one was built from, or one this process no longer remembers,
is retired to RETIRED_SET_TTL_MS, which its next use restores, so the sets of a churning fleet leave Redis
within seconds instead of ten minutes. The process remembers the RECENT_SETS sets it used last (a set of
10,000 keys is about 0.5 MiB of the service's memory: it kept 64 of them, and every key it ever uploaded).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from service.discovery.redis_pipe import StoreConnectionError, StoreTimeoutError

CANDIDATE_SET_TTL_MS = 600_000  # the scripts' own PEXPIRE at each use (redis_scripts.py)
RETIRED_SET_TTL_MS = 10_000  # a superseded set, unless a request uses it again
RECENT_SETS = 8  # sets this process remembers, and may build a new one from
PATCH_AT_MOST = 1000  # members added and removed: past this (or a quarter of the set) a set is uploaded whole
CHUNK = 1000  # members a command
DIGEST_BYTES = 20
DIGESTS = 1 << (8 * DIGEST_BYTES)

# KEYS: base set, new set, lru zset, a set to retire as well ('' none)
# ARGV: the new set's ttl (ms), a retired set's (ms), how many are added, the added..., the removed...
# 0: the base is gone (nothing done); 1: the new set is the base's members with the change.
PATCH = r"""
if redis.call('EXISTS', KEYS[2]) == 0 then  -- else another replica made it: the same members
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


@dataclass(frozen=True, slots=True)
class _Named:
    key: str
    digest: int


class CandidateSets:
    """The candidate sets in Redis: `key(members)` names one holding exactly `members`."""

    def __init__(self, client: aioredis.Redis, *, prefix: str) -> None:
        self._r = client
        self._p = prefix
        self._patch = client.register_script(PATCH)
        self._retire = client.register_script(RETIRE)
        self._salt: bytes | None = None
        self._named: dict[frozenset[str], _Named] = {}  # the RECENT_SETS sets last used, the latest last
        self._uploaded: set[str] = set()  # of their keys, those in Redis (as far as this process knows)
        self._uploading: dict[str, asyncio.Future[None]] = {}
        self.patched = self.whole = 0  # uploads of each kind, for tests and benches

    async def key(self, members: frozenset[str]) -> str:
        """The key of a set holding `members`, uploaded first if this process has not (one upload per set
        however many requests arrive while it runs)."""
        named = self._named.pop(members, None)
        near = None
        if named is None:
            salt = self._salt or await self._read_salt()
            near = self._nearest(members)
            if near is None:
                digest = _sum(salt, members)
            else:
                base, added, removed = near
                digest = (base.digest + _sum(salt, added) - _sum(salt, removed)) % DIGESTS
            named = _Named(f"{self._p}:cand:{digest:040x}", digest)
        self._named[members] = named  # the latest used last: the least recently used is forgotten first
        key = named.key
        if key not in self._uploaded:
            upload = self._uploading.get(key)
            if upload is None:
                upload = self._uploading[key] = asyncio.ensure_future(self._upload(key, members, near))
                upload.add_done_callback(lambda _: self._uploading.pop(key, None))
            await asyncio.shield(upload)
            if self._named.get(members) is named:  # not forgotten meanwhile
                self._uploaded.add(key)
        return key

    def gone(self, *keys: str) -> None:
        """A script found these keys missing (expired in Redis): the next use uploads them again."""
        self._uploaded.difference_update(keys)

    def remembered(self) -> int:
        return len(self._named)

    async def _read_salt(self) -> bytes:
        """The digests' key, shared by every replica through Redis (the first to need it sets it)."""
        name = f"{self._p}:cand-salt"
        try:
            await self._r.set(name, secrets.token_hex(16), nx=True)
            value = await self._r.get(name)
        except RedisConnectionError as exc:  # part of a lease: the API's 503, not a 500
            raise StoreConnectionError(f"reading the candidate sets' salt: {exc}") from exc
        except RedisTimeoutError as exc:
            raise StoreTimeoutError(f"reading the candidate sets' salt: {exc}") from exc
        if value is None:  # deleted in between: this process's own (names then differ from the others')
            value = secrets.token_hex(16)
        self._salt = str(value).encode()
        return self._salt

    def _forget_oldest(self) -> str:
        """Forget the least recently used set past RECENT_SETS (its key, to retire in Redis; '' none)."""
        if len(self._named) <= RECENT_SETS:
            return ""
        oldest = next(iter(self._named))
        key = self._named.pop(oldest).key
        self._uploaded.discard(key)
        return key

    def _nearest(self, members: frozenset[str]) -> tuple[_Named, list[str], list[str]] | None:
        """A set remembered that a small change turns into `members`: (it, added, removed), the most
        recently used first; None when there is none."""
        most = min(PATCH_AT_MOST, len(members) // 4)
        for base, named in reversed(self._named.items()):
            if abs(len(base) - len(members)) > most:  # (`members` itself is not among them)
                continue
            added = members - base
            if len(added) > most:
                continue
            removed = base - members
            if len(added) + len(removed) <= most:
                return named, sorted(added), sorted(removed)
        return None

    async def _upload(
        self, key: str, members: frozenset[str], near: tuple[_Named, list[str], list[str]] | None
    ) -> None:
        retire = self._forget_oldest()
        try:
            if near is not None and near[0].key in self._uploaded:
                base, added, removed = near
                args = [str(CANDIDATE_SET_TTL_MS), str(RETIRED_SET_TTL_MS), str(len(added)), *added, *removed]
                if await self._patch(keys=[base.key, key, f"{self._p}:lru", retire], args=args):
                    self.patched += 1
                    return
                self._uploaded.discard(base.key)  # gone from Redis: the set goes whole
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


def _sum(salt: bytes, members: Iterable[str]) -> int:
    """The members' digest: the sum of each one's keyed hash, so that a set's is its base's plus the
    change's (an additive multiset hash: keyed, the sum of chosen members cannot be steered)."""
    total = 0
    for member in members:
        hashed = hashlib.blake2b(member.encode(), key=salt, digest_size=DIGEST_BYTES).digest()
        total += int.from_bytes(hashed, "big")
    return total % DIGESTS
