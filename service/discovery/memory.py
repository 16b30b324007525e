"""In-memory store for one replica: plain dicts under one lock, so every decision is atomic.

LRU order is a `HandOutOrder` of every proxy ever offered (front = least recently handed out); a lease walks
it from the front and usually stops after a few keys, so a lease costs O(count) in the common case, not
O(fleet).
The uncommon case is a long run of proxies at the front that this client may not have for this target (banned
there, or all held because the fleet turns over faster than the cooldown): the walk remembers where that run
ended and until when all of it stays ineligible (a `_Resume`), and the next lease for the same client and
target starts after it. A release, renewal or good report that could end the run sooner forgets it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace

from service.discovery.fair_share import MemoryHoldings, charged, rate_allowance
from service.discovery.handout_order import HandOutOrder
from service.discovery.holds import HoldTable, PairIds
from service.discovery.lease_table import ENDED_KEPT, LEASE_GRACE, LeaseTable
from service.discovery.report_book import ReportBook
from service.discovery.report_summary import ReportEntry, ReportSummaries
from service.discovery.store import (
    Acquired,
    AcquireRequest,
    BoundSession,
    ErrorVotes,
    FairShare,
    LeaseRecord,
    Limited,
    Penalty,
)

SWEEP_EVERY = 60.0  # expired entries are swept at most this often (store-clock seconds)
STRIKES_KEEP = 7 * 86400.0  # a penalty's strikes are forgotten this long after it ended (as in RedisStore)
RESUME_AFTER = 16  # a walk remembers an ineligible run at the front once it is this long
NO_PENALTY = (0.0, 0)
INFINITY = float("inf")


@dataclass(frozen=True)
class _Resume:
    """Every candidate up to `position` in the walk of this order is ineligible for its client and target
    until `until`, as long as the candidates are the same, the order's positions are the same or carried
    over a compaction (`HandOutOrder.carried`) and no good report forgave a penalty for the target since
    (`forgiven`)."""

    candidates: Collection[str]
    epoch: int
    position: int
    until: float
    forgiven: int


class MemoryStore:
    def __init__(self, *, ended_kept: int = ENDED_KEPT, report_keep: float = LEASE_GRACE) -> None:
        """`ended_kept`: at most this many ended leases are kept for late reports (the oldest ended go
        first), each for at most LEASE_GRACE seconds; running leases are always kept (lease_table.py).
        `report_keep`: how long who held which proxy and the `error` votes are kept (the longest window a
        report looks back: each (client, proxy) pair a lease ended on is one entry)."""
        self._lock = threading.Lock()
        self._lru = HandOutOrder()
        self._resume: dict[tuple[str, str], _Resume] = {}  # (client, target) -> where its walk resumes
        self._forgiven: dict[str, int] = {}  # target -> good reports that removed a penalty
        self._pairs = PairIds()  # (client, target) -> a small id, for the leases and the holds
        self._holds = HoldTable(self._pairs)  # (client, target, proxy) -> until: running leases, cooldowns
        self._penalty: dict[str, dict[str, tuple[float, int]]] = {}  # target -> proxy -> (until, strikes)
        self._holdings = MemoryHoldings()
        self._leases = LeaseTable(ended_kept=ended_kept, on_end=self._lease_ended, pairs=self._pairs)
        self._report_keep = report_keep
        self._sessions: dict[tuple[str, str], tuple[str, float]] = {}  # -> (proxy, idle expiry)
        self._last_candidates: Collection[str] | None = None
        self._next_sweep = 0.0
        self._reports = ReportBook()
        self._summaries = ReportSummaries()

    async def acquire(self, request: AcquireRequest, *, now: float) -> Acquired:
        with self._lock:
            self._maybe_sweep(now)
            self._learn(request.candidates)
            return self._acquire(request, now)

    def _acquire(self, request: AcquireRequest, now: float) -> Acquired:
        # what the client holds is counted from here on: every lease that ended by `now` ends first
        self._leases.expire(now)
        self._leases.forget(now)
        pair = (request.client, request.target)
        pair_id = self._pairs.find(request.client, request.target)  # None: it holds nothing
        holds = self._holds
        penalised = self._penalty.get(request.target, {})
        candidates, ignore_cooldown = request.candidates, request.ignore_cooldown
        count, share = request.count, request.share
        if share is not None and share.rate is not None:
            fits, next_at = rate_allowance(
                self._holdings.bucket(request.client), now=now, rate=share.rate, burst=share.burst
            )
            if fits < 1:
                return Acquired(leases=[], earliest=None, limited=Limited("lease_rate", next_at))
            count = min(count, fits)
        holdings, client, target = self._holdings, request.client, request.target
        pool: Collection[str] = ()  # the share's pool, where a limit applies
        room: int | None = None  # distinct proxies the client may still add; None: no limit applies
        full = False  # its share is taken: only the proxies it holds (for other targets) may come again
        only_held = False  # full, and the held ones are many: the walk skips the others
        if (
            share is not None
            and share.holding is not None
            and not self._far_under(request, share, count, now)
        ):
            pool = share.pool
            held_now = holdings.held_count(client, target=target, pool=pool, now=now)
            room = share.holding - held_now
            if room <= 0:
                room, full = None, True
                if held_now * 8 < len(self._lru):  # few: sort them (a walk would pass the others first)
                    mine = holdings.held_keys(client, target=target, pool=pool, now=now)
                    candidates = mine.intersection(candidates)
                else:  # a client holding its whole pool walks the LRU as any big set does
                    only_held = True
        walk = len(candidates) * 8 >= len(self._lru) and candidates is request.candidates
        # a remembered run is for the request's own candidates: the held ones change with every hand-out
        resume = self._resumable(pair, candidates, now) if walk and not (ignore_cooldown or full) else None
        run_end, run_until = (resume.position, resume.until) if resume else (-1, INFINITY)
        if only_held:  # none it holds is less recently used than its oldest running take or its bans
            run_end = self._held_from(client, target=target, now=now) - 1
        earliest = run_until if run_until < INFINITY else None
        picked: list[str] = []
        skipped = 0  # the ineligible run at the front, as far as this walk saw it
        for position, key in self._order(candidates, walk=walk, start=run_end + 1):
            at = INFINITY  # not a candidate: ineligible for as long as the candidates are these
            if key in candidates and (
                not only_held or (key in pool and holdings.holds(client, target=target, proxy=key, now=now))
            ):
                at = penalised.get(key, NO_PENALTY)[0]
                if not ignore_cooldown and pair_id is not None:
                    at = max(at, holds.get(pair_id, key))
                if at <= now:
                    picked.append(key)
                    if room is not None and not (
                        key in pool and holdings.holds(client, target=target, proxy=key, now=now)
                    ):
                        room -= 1
                    if len(picked) == count or room == 0:
                        break
                    continue
                if earliest is None or at < earliest:
                    earliest = at
            if not picked:
                run_end, run_until, skipped = position, min(run_until, at), skipped + 1
        if skipped >= RESUME_AFTER and walk and not (ignore_cooldown or full):
            self._remember(pair, candidates, position=run_end, until=run_until)
        leases = self._hand_out(request, picked, pair_id=pair_id, now=now)
        limited = None
        if not leases and full and self._kept_away(request, candidates, pool, only_held=only_held, now=now):
            # when it holds each (every lease's end): counted only for the answer that it must wait
            ends = holdings.held(
                client, target=target, pool=pool, now=now, ends=self._leases.ends_of(client, now=now)
            )
            until = min(ends.values())
            limited = Limited("lease_share", min(until, earliest) if earliest is not None else until)
        return Acquired(leases=leases, earliest=earliest, limited=limited)

    def _kept_away(
        self,
        request: AcquireRequest,
        candidates: Collection[str],
        pool: Collection[str],
        *,
        only_held: bool,
        now: float,
    ) -> bool:
        """Did the share keep some candidate away (one the client does not hold)? Then a 429, not a 503."""
        if not only_held:
            return len(candidates) < len(request.candidates)
        client, target = request.client, request.target
        return any(
            not (key in pool and self._holdings.holds(client, target=target, proxy=key, now=now))
            for key in request.candidates
        )

    def _held_from(self, client: str, *, target: str, now: float) -> int:
        """Where a walk for the proxies the client holds starts: the first position handed out since its
        oldest running lease was (each proxy it leases was handed out again to it since, at the latest),
        or a proxy it holds by a ban, whichever comes first (at its share of 10,000 with half of them held,
        a walk from the front passed the 5,000 it no longer holds on every request)."""
        oldest = self._leases.oldest_handed(client)
        start = self._lru.since(oldest if oldest is not None else INFINITY)
        for proxy in self._holdings.running_bans(client, target=target, now=now):
            start = min(start, self._lru.position(proxy))
        return max(start, 0)

    def _far_under(self, request: AcquireRequest, share: FairShare, count: int, now: float) -> bool:
        """Can this request not reach the client's holding limit, however it goes? Then no limit applies to
        it, and its holdings need not be counted (a client that never releases holds thousands)."""
        assert share.holding is not None
        most = self._holdings.most_held(request.client, target=request.target)
        return most + count <= share.holding

    def _hand_out(
        self, request: AcquireRequest, picked: list[str], *, pair_id: int | None, now: float
    ) -> list[LeaseRecord]:
        """`pair_id`: the request's pair's, when something used it before these leases."""
        leases = [
            self._lease(request, key=key, lease_id=lid, now=now)
            for key, lid in zip(picked, request.lease_ids, strict=False)
        ]
        share = request.share
        tat = None
        if share is not None and share.rate is not None and leases:
            tat = charged(self._holdings.bucket(request.client), now=now, rate=share.rate, count=len(leases))
        holds = self._holds
        if pair_id is None and leases:
            pair_id = self._pairs.find(request.client, request.target)  # the leases just taken name it
        for lease in leases:
            assert pair_id is not None
            until = lease.expires_at if request.ttl > request.cooldown else now + request.cooldown
            holds.raise_to(pair_id, lease.proxy, until)  # a sticky re-use never lowers it
            self._reports.held(client=lease.client, proxy=lease.proxy, until=lease.expires_at)
            self._holdings.took(lease.client, proxy=lease.proxy, tat=tat)
            self._lru.touch(lease.proxy, now)
        return leases

    def _resumable(self, pair: tuple[str, str], candidates: Collection[str], now: float) -> _Resume | None:
        resume = self._resume.get(pair)
        if (
            resume is None
            or resume.candidates is not candidates
            or resume.until <= now
            or resume.forgiven != self._forgiven.get(pair[1], 0)
        ):
            return None
        if resume.epoch != self._lru.epoch:  # a compaction since: the same run, at its new positions
            position = self._lru.carried(resume.position, resume.epoch)
            if position is None or position < 0:  # none of the run is left before the others: walk afresh
                return None
            resume = self._resume[pair] = replace(resume, epoch=self._lru.epoch, position=position)
        return resume

    def _remember(
        self, pair: tuple[str, str], candidates: Collection[str], *, position: int, until: float
    ) -> None:
        self._resume[pair] = _Resume(
            candidates=candidates,
            epoch=self._lru.epoch,
            position=position,
            until=until,
            forgiven=self._forgiven.get(pair[1], 0),
        )

    def _lease(self, request: AcquireRequest, *, key: str, lease_id: str, now: float) -> LeaseRecord:
        lease = LeaseRecord(
            lease_id=lease_id,
            client=request.client,
            target=sys.intern(request.target),  # one string per target, not per lease
            proxy=key,
            handed_at=now,
            expires_at=now + request.ttl,
        )
        self._leases.taken(lease)
        return lease

    def _order(self, candidates: Collection[str], *, walk: bool, start: int) -> Iterable[tuple[int, str]]:
        """(position, candidate), least recently used first: walk the LRU for big sets, sort small ones (a
        session's, a small pool's)."""
        if walk:
            return self._lru.walk(start)
        return sorted((self._lru.position(key), key) for key in candidates)

    def _learn(self, candidates: Collection[str]) -> None:
        # New proxies go to the front: never used is the least recently used.
        if candidates is self._last_candidates:
            return
        self._lru.learn(candidates)
        if len(candidates) > 64:  # remember big sets only: a session's one-proxy set must not evict them
            self._last_candidates = candidates

    async def get_lease(self, lease_id: str, *, now: float) -> LeaseRecord | None:
        return self._get(lease_id)

    def _get(self, lease_id: str) -> LeaseRecord | None:
        return self._leases.record(lease_id)

    async def release(self, lease_id: str, *, now: float, cooldown: float) -> LeaseRecord | None:
        with self._lock:
            lease = self._get(lease_id)
            if lease is None or lease.released or lease.expires_at <= now:
                return None
            pair_id = self._kept_pair(lease)
            if (
                self._holds.get(pair_id, lease.proxy, -INFINITY) == lease.expires_at
            ):  # the hold is this lease's
                self._holds.put(pair_id, lease.proxy, max(lease.handed_at + cooldown, now))
                self._resume.pop((lease.client, lease.target), None)
            self._leases.released(lease_id, now=now)
            return replace(lease, expires_at=now, released=True)

    async def renew(self, lease_id: str, *, now: float, ttl: float, cooldown: float) -> LeaseRecord | None:
        with self._lock:
            lease = self._get(lease_id)
            if lease is None or lease.released or lease.expires_at <= now:
                return None
            until = now + ttl
            pair_id = self._kept_pair(lease)
            current = self._holds.get(pair_id, lease.proxy)
            if current == lease.expires_at or current < until:  # the hold is this lease's (or shorter)
                self._holds.put(pair_id, lease.proxy, max(lease.handed_at + cooldown, until))
                self._resume.pop((lease.client, lease.target), None)
            self._reports.held(client=lease.client, proxy=lease.proxy, until=until)
            self._leases.renewed(lease_id, until=until)
            return replace(lease, expires_at=until)

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
        with self._lock:
            reporter = None
            if lease_id is not None:
                reporter = self._leases.mark_banned(lease_id)
                if reporter is None:
                    return None  # counted once already (a retried report), or gone
            per_target = self._penalty.setdefault(target, {})
            until, strikes = per_target.get(proxy, (0.0, 0))
            until = max(until, now + fraction * min(cap, base * 2 ** min(strikes, 40)))
            per_target[proxy] = (until, strikes + 1)
            if reporter is not None:
                self._holdings.banned(reporter, target=target, proxy=proxy, until=until)
            return Penalty(target=target, until=until, strikes=strikes + 1)

    async def forgive(self, *, proxy: str, target: str, now: float) -> bool:
        with self._lock:
            per_target = self._penalty.get(target, {})
            if per_target.get(proxy, NO_PENALTY)[0] > now:
                return False  # a running ban ends by itself
            if per_target.pop(proxy, None) is not None:
                self._forgiven[target] = self._forgiven.get(target, 0) + 1
            return True

    async def last_held(self, *, client: str, proxy: str) -> float | None:
        with self._lock:
            return self._reports.last_held(client=client, proxy=proxy)

    async def vote_error(self, *, proxy: str, client: str, now: float, window: float) -> ErrorVotes:
        with self._lock:
            return self._reports.vote_error(proxy=proxy, client=client, now=now, window=window)

    async def count_report(self, *, client: str, now: float, period: float) -> tuple[int, float]:
        with self._lock:
            return self._reports.count_report(client=client, now=now, period=period)

    async def note_report(self, *, proxy: str, target: str, client: str, kind: str, now: float) -> None:
        with self._lock:
            self._summaries.note(proxy=proxy, target=target, client=client, kind=kind, now=now)

    async def reports_on(self, proxy: str, *, now: float) -> list[ReportEntry]:
        with self._lock:
            return self._summaries.read(proxy, now=now)

    async def penalties(self, proxy: str, *, now: float) -> list[Penalty]:
        with self._lock:
            found = [(t, p[proxy]) for t, p in self._penalty.items() if proxy in p]
        return [Penalty(target=t, until=u, strikes=n) for t, (u, n) in sorted(found) if u > now]

    async def penalty_until(self, *, proxy: str, target: str) -> float:
        return self._penalty.get(target, {}).get(proxy, (0.0, 0))[0]

    async def sticky(
        self, request: AcquireRequest, *, session: str, idle: float, now: float
    ) -> Acquired | BoundSession | None:
        with self._lock:
            self._maybe_sweep(now)
            found = self._sessions.get((request.client, session))
            if found is None or found[1] <= now:
                return None
            proxy = found[0]
            penalty = self._penalty.get(request.target, {}).get(proxy, NO_PENALTY)[0]
            pool = request.share.pool if request.share is not None else ()
            if proxy not in pool or penalty > now:
                return BoundSession(proxy, penalty)
            self._sessions[(request.client, session)] = (proxy, now + idle)
            candidates = (proxy,)
            self._learn(candidates)
            return self._acquire(replace(request, candidates=candidates), now)

    async def bind_session(self, *, client: str, session: str, proxy: str, now: float, idle: float) -> None:
        with self._lock:
            self._sessions[(client, session)] = (proxy, now + idle)

    async def sessions_on(self, proxies: Sequence[str], *, now: float) -> dict[str, int]:
        wanted = set(proxies)
        found = dict.fromkeys(proxies, 0)
        with self._lock:
            for proxy, until in self._sessions.values():
                if proxy in wanted and until > now:
                    found[proxy] += 1
        return found

    async def active_leases(self, client: str, *, now: float) -> list[LeaseRecord]:
        with self._lock:
            found = [self._get(lease_id) for lease_id in self._leases.active(client, now=now)]
        return [lease for lease in found if lease is not None and not lease.released]

    def kept_leases(self, *, now: float) -> tuple[int, int]:
        """(leases running at `now`, ended leases still kept for late reports)."""
        with self._lock:
            return self._leases.counts(now=now)

    def kept_holds(self) -> int:
        """(client, target, proxy) holds kept: running leases' and cooldowns' (until a sweep, some ended)."""
        with self._lock:
            return len(self._holds)

    def kept_pairs(self) -> int:
        """(client, proxy) pairs kept for reports (who held which proxy)."""
        with self._lock:
            return self._reports.pairs()

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None

    def _lease_ended(self, client: str, target: str, proxy: str, end: float) -> None:
        """A running lease ended at `end` (expired, or released then). Its hold goes with it unless a
        cooldown or a longer lease on the same proxy keeps it (a hold kept a minute past its end by the
        sweep was 1.7 MiB at 500 leases a second: census run 27 in operations.md)."""
        self._holdings.ended(client, proxy)
        pair_id = self._pairs.find(client, target)  # its slot names it until it is forgotten
        if pair_id is not None:
            self._holds.end_by(pair_id, proxy, end)

    def _kept_pair(self, lease: LeaseRecord) -> int:
        """The pair id of a lease the table keeps (its slot names it)."""
        pair_id = self._pairs.find(lease.client, lease.target)
        assert pair_id is not None, lease
        return pair_id

    def _maybe_sweep(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_EVERY
        self._holds.sweep(now)
        for pair in [p for p, (_, until) in self._sessions.items() if until <= now]:
            del self._sessions[pair]
        lru = self._lru
        for pair, r in list(self._resume.items()):
            if r.until <= now or lru.carried(r.position, r.epoch) is None:
                del self._resume[pair]
        self._reports.sweep(now=now, keep=self._report_keep)
        for target, per_target in list(self._penalty.items()):  # strikes are forgotten as Redis's expire
            for proxy in [p for p, (until, _) in per_target.items() if until + STRIKES_KEEP <= now]:
                del per_target[proxy]
            if not per_target:
                del self._penalty[target]
        self._summaries.sweep(now=now)
        self._holdings.sweep(now=now)
        self._leases.sweep(now)
