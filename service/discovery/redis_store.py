"""Redis store: the state several replicas share. Decisions run as Lua scripts (atomic in Redis).

Keys (prefix P): `P:hold:<client>|<target>` zset proxy -> held-until, `P:pen:<target>` zset proxy ->
penalised-until, `P:strikes:<proxy>` hash target -> bans since the last good report, `P:lru` zset proxy ->
last hand-out, `P:lease:<id>` hash, `P:sess:<client>|<session>` hash, `P:skip:<target>` hash client -> where
its next walk of the LRU resumes (see redis_scripts.py); for reports, `P:used:<client>` zset proxy -> end of
its latest lease, `P:err:<proxy>` zset client -> its `error` vote, `P:rate:<client>:<window>` a counter; for
fair shares (fair_share.py), `P:running:<client>` zset lease id -> end of each running lease (the
scripts' `act`; named `P:act:<client>` before the counts below, and renamed so that a replica of an older
version never changes it without them during a rolling upgrade), `P:banby:<client>|<target>` zset proxy ->
end of a penalty its report set for that target, the counts kept with `act` (redis_share_scripts.COUNTS):
`P:pcnt:<client>` hash proxy -> its running leases there, `P:pnum:<client>` their sum, `P:pin:<client>` hash
pool set -> the proxies of that set it leases, `P:ptake:<client>` zset proxy it leases -> its last take;
and `P:lrate:<client>` its rate bucket; for the report summary (report_summary.py), `P:rep:<proxy>` hash
entry -> reports and `P:repat:<proxy>` zset entry -> latest report.
Candidate sets too large to list with a call are `P:cand:<digest>` sets, named with `P:cand-salt`
(redis_sets.py). Every key but `P:lru` and `P:cand-salt` carries a TTL.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any, cast

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from service.discovery import redis_scripts
from service.discovery.redis_pipe import RedisPipe
from service.discovery.redis_sets import CandidateSets
from service.discovery.report_summary import (
    KEEP_SECONDS,
    MOST,
    NOTE_REPORT,
    ReportEntry,
    entry_of,
    field_of,
    newest_first,
)
from service.discovery.store import (
    Acquired,
    AcquireRequest,
    BoundSession,
    ErrorVotes,
    LeaseRecord,
    Limited,
    Penalty,
)

LEASE_GRACE = 3600.0
SMALL_SET = 64  # up to this many candidates travel with the call; larger sets are uploaded once by digest
STRIKES_KEEP = 7 * 86400.0
MAX_CONNECTIONS = 32  # Redis runs one command at a time: more connections add only its overhead
POOL_TIMEOUT_SECONDS = 10.0


def _f(value: float) -> str:
    return f"{value:.6f}"


class RedisStore:
    def __init__(
        self, client: aioredis.Redis, *, prefix: str = "proxy-operator", small_set: int = SMALL_SET
    ) -> None:
        self._r = client
        self._small_set = small_set
        self._p = prefix
        self._acquire = client.register_script(redis_scripts.ACQUIRE)
        self._release = client.register_script(redis_scripts.RELEASE)
        self._renew = client.register_script(redis_scripts.RENEW)
        self._penalise = client.register_script(redis_scripts.PENALISE)
        self._forgive = client.register_script(redis_scripts.FORGIVE)
        self._bind = client.register_script(redis_scripts.BIND_SESSION)
        self._sticky = client.register_script(redis_scripts.STICKY)
        self._pipe = RedisPipe.for_client(client)  # the per-request commands; redis-py for the rest
        self._acquire_set = client.register_script(redis_scripts.ACQUIRE_FROM_SET)
        self._error_vote = client.register_script(redis_scripts.ERROR_VOTE)
        self._count_report = client.register_script(redis_scripts.COUNT_REPORT)
        self._note_report = client.register_script(NOTE_REPORT)
        self._sets = CandidateSets(client, prefix=prefix)

    @property
    def client(self) -> aioredis.Redis:
        """The pooled client, shared with the fleet page's ended sessions (service/ui/session.py)."""
        return self._r

    @property
    def prefix(self) -> str:
        return self._p

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "proxy-operator", small_set: int = SMALL_SET) -> RedisStore:
        """A client whose requests queue for one of `MAX_CONNECTIONS` connections (redis-py's default pool
        raises `Too many connections` past 100 requests in flight: a 500 under load)."""
        pool = aioredis.BlockingConnectionPool.from_url(
            url, decode_responses=True, max_connections=MAX_CONNECTIONS, timeout=POOL_TIMEOUT_SECONDS
        )
        return cls(aioredis.Redis.from_pool(pool), prefix=prefix, small_set=small_set)

    async def acquire(self, request: AcquireRequest, *, now: float) -> Acquired:
        listed = len(request.candidates) <= self._small_set
        for _ in range(2):  # a set may have expired in Redis since this process uploaded it: upload again
            share = await self._share_key(request)
            limits = self._limit_keys(request, share)
            counts = self._count_keys(request.client)
            if listed:
                keys = [*self._keys(request), self._used_key(request.client), *limits, *counts]
                args = [*self._args(request, now=now), *request.candidates]
                out = await self._run(self._acquire, keys=keys, args=args)
                cand = ""
            else:
                cand = await self._sets.key(_frozen(request.candidates))
                keys = [
                    *self._keys(request),
                    self._used_key(request.client),
                    cand,
                    self._skip_key(request.target),
                    *limits,
                    *counts,
                ]
                out = await self._run(self._acquire_set, keys=keys, args=self._args(request, now=now))
            if out[0] != "nocand":
                return self._acquired(out, request=request, now=now)
            self._sets.gone(cand, share)
        raise RuntimeError("a candidate set vanished twice in a row from Redis")

    async def _share_key(self, request: AcquireRequest) -> str:
        """The set a client's share is counted over, when that is not the candidates themselves (a sticky
        session's request is for its one proxy, its share is of the pool); '' otherwise."""
        share = request.share
        if share is None or share.holding is None or share.pool is request.candidates:
            return ""
        return await self._sets.key(_frozen(share.pool))

    def _limit_keys(self, request: AcquireRequest, share: str) -> list[str]:
        """The fair share's keys, in the order the acquire scripts and STICKY all take them."""
        return [
            self._act_key(request.client),
            self._rate_key(request.client),
            share,
            f"{self._p}:banby:{request.client}|{request.target}",
        ]

    def _count_keys(self, client: str) -> list[str]:
        """The client's share counts (redis_share_scripts.COUNTS): proxy -> its running leases there, and
        pool set -> the proxies of that set it leases."""
        return [f"{self._p}:{name}:{client}" for name in ("pcnt", "pin", "pnum", "ptake")]

    def _keys(self, request: AcquireRequest) -> list[str]:
        hold = self._hold_key(request.client, request.target)
        return [hold, f"{self._p}:pen:{request.target}", f"{self._p}:lru"]

    def _args(self, request: AcquireRequest, *, now: float) -> list[str]:
        ids = list(request.lease_ids)[: request.count]
        share = request.share
        holding = share.holding if share is not None else None
        rate = share.rate if share is not None else None
        return [
            _f(now),
            str(request.count),
            _f(request.ttl),
            _f(request.cooldown),
            request.client,
            request.target,
            f"{self._p}:lease:",
            _f(LEASE_GRACE),
            "1" if request.ignore_cooldown else "0",
            "" if holding is None else str(holding),
            "" if rate is None else repr(float(rate)),
            "" if share is None else repr(float(share.burst)),
            str(len(ids)),
            *ids,
        ]

    def _acquired(self, out: list[str], *, request: AcquireRequest, now: float) -> Acquired:
        if out[0] == "limited":
            return Acquired(leases=[], earliest=None, limited=Limited(out[1], float(out[2])))
        earliest = float(out[0]) if out[0] else None
        leases = [
            LeaseRecord(
                lease_id=lid,
                client=request.client,
                target=request.target,
                proxy=key,
                handed_at=now,
                expires_at=now + request.ttl,
            )
            for lid, key in zip(out[1::2], out[2::2], strict=True)
        ]
        return Acquired(leases=leases, earliest=earliest)

    async def get_lease(self, lease_id: str, *, now: float) -> LeaseRecord | None:
        key = f"{self._p}:lease:{lease_id}"
        if self._pipe is None:
            fields = cast(dict[str, str], await self._r.hgetall(key))  # decoded
        else:
            flat = await self._pipe.call("HGETALL", key)
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
        if not fields:
            return None
        return LeaseRecord(
            lease_id=lease_id,
            client=fields["client"],
            target=fields["target"],
            proxy=fields["proxy"],
            handed_at=float(fields["handed"]),
            expires_at=float(fields["expires"]),
            released=fields.get("released") == "1",
            banned=fields.get("banned") == "1",
        )

    async def release(self, lease_id: str, *, now: float, cooldown: float) -> LeaseRecord | None:
        out = await self._run(
            self._release,
            keys=[f"{self._p}:lease:{lease_id}"],
            args=[
                *(
                    _f(now),
                    _f(cooldown),
                    f"{self._p}:hold:",
                    f"{self._p}:skip:",
                    f"{self._p}:running:",
                    lease_id,
                ),
                f"{self._p}:lease:",
                *(f"{self._p}:{name}:" for name in ("pcnt", "pin", "pnum", "ptake")),
            ],
        )
        return await self.get_lease(lease_id, now=now) if out == "ok" else None

    async def renew(self, lease_id: str, *, now: float, ttl: float, cooldown: float) -> LeaseRecord | None:
        args = [
            *(_f(now), _f(ttl), _f(cooldown), f"{self._p}:hold:", _f(LEASE_GRACE), f"{self._p}:skip:"),
            f"{self._p}:used:",
            f"{self._p}:running:",
            lease_id,
            *(f"{self._p}:{name}:" for name in ("pcnt", "pin", "pnum", "ptake")),
        ]
        out = await self._run(self._renew, keys=[f"{self._p}:lease:{lease_id}"], args=args)
        return await self.get_lease(lease_id, now=now) if out == "ok" else None

    async def penalise(
        self,
        *,
        proxy: str,
        target: str,
        now: float,
        base: float,
        cap: float,
        fraction: float,
        lease_id: str | None = None,
    ) -> Penalty | None:
        lease = "" if lease_id is None else f"{self._p}:lease:{lease_id}"
        out = await self._run(
            self._penalise,
            keys=[f"{self._p}:pen:{target}", f"{self._p}:strikes:{proxy}", lease],
            args=[
                *(proxy, target, _f(now), _f(base), _f(cap), f"{fraction:.12f}", _f(STRIKES_KEEP)),
                f"{self._p}:banby:",
            ],
        )
        if out[0] == "dup":
            return None
        until, strikes = out
        return Penalty(target=target, until=float(until), strikes=int(strikes))

    async def forgive(self, *, proxy: str, target: str, now: float) -> bool:
        keys = [f"{self._p}:pen:{target}", f"{self._p}:strikes:{proxy}", self._skip_key(target)]
        return bool(await self._run(self._forgive, keys=keys, args=[proxy, target, _f(now)]) == "ok")

    async def last_held(self, *, client: str, proxy: str) -> float | None:
        score = await self._r.zscore(self._used_key(client), proxy)
        return float(score) if score is not None else None

    async def vote_error(self, *, proxy: str, client: str, now: float, window: float) -> ErrorVotes:
        voters, new = await self._run(
            self._error_vote, keys=[f"{self._p}:err:{proxy}"], args=[client, _f(now), _f(window)]
        )
        return ErrorVotes(voters=int(voters), new=int(new) == 1)

    async def count_report(self, *, client: str, now: float, period: float) -> tuple[int, float]:
        window = math.floor(now / period)
        lifetime = str(int((period + 60) * 1000))
        key = f"{self._p}:rate:{client}:{window}"
        count = await self._run(self._count_report, keys=[key], args=[lifetime])
        return int(count), (window + 1) * period

    async def note_report(self, *, proxy: str, target: str, client: str, kind: str, now: float) -> None:
        name = field_of(target=target, client=client, kind=kind)
        keys = [f"{self._p}:rep:{proxy}", f"{self._p}:repat:{proxy}"]
        await self._run(self._note_report, keys=keys, args=[name, _f(now), _f(KEEP_SECONDS), str(MOST)])

    async def reports_on(self, proxy: str, *, now: float) -> list[ReportEntry]:
        counts = cast(dict[str, str], await self._r.hgetall(f"{self._p}:rep:{proxy}"))
        latest = cast(
            list[tuple[str, float]],
            await self._r.zrangebyscore(
                f"{self._p}:repat:{proxy}", f"({_f(now - KEEP_SECONDS)}", "+inf", withscores=True
            ),
        )
        found = [entry_of(name, count=int(counts.get(name, 0)), last=float(at)) for name, at in latest]
        return newest_first([e for e in found if e.count > 0])

    async def penalties(self, proxy: str, *, now: float) -> list[Penalty]:
        strikes = cast(dict[str, str], await self._r.hgetall(f"{self._p}:strikes:{proxy}"))
        found = []
        for target in sorted(strikes):
            until = await self.penalty_until(proxy=proxy, target=target)
            if until > now:
                found.append(Penalty(target=target, until=until, strikes=int(strikes[target])))
        return found

    async def penalty_until(self, *, proxy: str, target: str) -> float:
        key = f"{self._p}:pen:{target}"
        score = await (
            self._r.zscore(key, proxy) if self._pipe is None else self._pipe.call("ZSCORE", key, proxy)
        )
        return float(score) if score is not None else 0.0

    async def sticky(
        self, request: AcquireRequest, *, session: str, idle: float, now: float
    ) -> Acquired | BoundSession | None:
        assert request.share is not None
        pool = request.share.pool
        for _ in range(2):  # a set may have expired in Redis since this process uploaded it: upload again
            share = await self._share_key(request)  # the pool's set when a holding limit applies
            listed: Collection[str] = ()
            if share:
                pool_key = share
            elif len(pool) <= self._small_set:
                pool_key, listed = "", pool
            else:
                pool_key = await self._sets.key(_frozen(pool))
            keys = [
                self._session_key(request.client, session),
                *self._keys(request),
                self._used_key(request.client),
                *self._limit_keys(request, share),
                pool_key,
                *self._count_keys(request.client),
            ]
            binding = [_f(now + idle), str(int((idle + 60) * 1000)), f"{request.client}|{session}"]
            args = [*self._args(request, now=now), *binding, self._sessby_key(""), *listed]
            out = await self._run(self._sticky, keys=keys, args=args)
            if out[0] == "unbound":
                return None
            if out[0] == "bound":
                return BoundSession(str(out[1]), float(out[2]) if out[2] else 0.0)
            if out[0] != "nocand":
                return self._acquired(out, request=request, now=now)
            self._sets.gone(share, pool_key)
        raise RuntimeError("a candidate set vanished twice in a row from Redis")

    async def bind_session(self, *, client: str, session: str, proxy: str, now: float, idle: float) -> None:
        keys = [self._session_key(client, session), self._sessby_key(proxy)]
        lifetime = str(int((idle + 60) * 1000))
        args = [proxy, _f(now + idle), lifetime, f"{client}|{session}", self._sessby_key(""), _f(now)]
        await self._run(self._bind, keys=keys, args=args)

    async def sessions_on(self, proxies: Sequence[str], *, now: float) -> dict[str, int]:
        async with self._r.pipeline(transaction=False) as pipe:
            for proxy in proxies:
                pipe.zcount(self._sessby_key(proxy), f"({_f(now)}", "+inf")
            counts = await pipe.execute()
        return {proxy: int(n) for proxy, n in zip(proxies, counts, strict=True)}

    def _sessby_key(self, proxy: str) -> str:
        return f"{self._p}:sessby:{proxy}"

    async def active_leases(self, client: str, *, now: float) -> list[LeaseRecord]:
        ids = cast(list[str], await self._r.zrangebyscore(self._act_key(client), f"({_f(now)}", "+inf"))
        found = [await self.get_lease(lease_id, now=now) for lease_id in ids]
        return [lease for lease in found if lease is not None and not lease.released]

    async def ping(self) -> bool:
        try:
            return bool(await self._r.ping())
        except RedisError:
            return False

    async def close(self) -> None:
        if self._pipe is not None:
            await self._pipe.close()
        await self._r.aclose()

    async def _run(self, script: AsyncScript, *, keys: list[str], args: list[str]) -> Any:
        if self._pipe is None:
            return await script(keys=keys, args=args)
        return await self._pipe.script(script.sha, str(script.script), keys, args)

    def _hold_key(self, client: str, target: str) -> str:
        return f"{self._p}:hold:{client}|{target}"

    def _act_key(self, client: str) -> str:
        return f"{self._p}:running:{client}"

    def _rate_key(self, client: str) -> str:
        return f"{self._p}:lrate:{client}"

    def _used_key(self, client: str) -> str:
        return f"{self._p}:used:{client}"

    def _skip_key(self, target: str) -> str:
        return f"{self._p}:skip:{target}"

    def _session_key(self, client: str, session: str) -> str:
        return f"{self._p}:sess:{client}|{session}"


def _frozen(members: Collection[str]) -> frozenset[str]:
    return members if isinstance(members, frozenset) else frozenset(members)
