"""What pools learn from the running service: health, leases, ban reports and unmet lease requests.

`PoolSignals` is discovery's observer (`service/discovery/observer.py`) and reads health from the inventory.
It counts in this process only: with several replicas serving discovery, each counts what it served (the
decisions run on the leader, which sees its own share; see docs/pools.md).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from service.discovery.store import LeaseRecord
from service.inventory import HealthState, Inventory
from service.pools.memory import Observed
from service.pools.naming import Member
from service.pools.rotation import Observe
from stacks.models import ProxyPool
from stacks.models.pool import seconds

KEEP_SECONDS = 86400.0  # ban reports and unmet requests older than this are dropped


class PoolSignals:
    def __init__(self, inventory: Inventory, *, clock: Callable[[], float] = time.time) -> None:
        self.inventory = inventory
        self._clock = clock
        self._lock = threading.Lock()
        self._bans: dict[str, dict[str, float]] = {}  # proxy key -> client -> latest ban report
        self._leased: dict[str, float] = {}  # proxy key -> latest hand-out
        self._lease_ends: dict[str, float] = {}  # proxy key -> latest end of a lease on it
        self._unmet: dict[str, deque[float]] = {}  # pool name -> times of lease requests answered 503
        self._unhealthy_since: dict[str, float] = {}

    # --- discovery's observer ---------------------------------------------------------------------------

    def leased(self, leases: Iterable[LeaseRecord]) -> None:
        now = self._clock()
        with self._lock:
            for lease in leases:
                self._leased[lease.proxy] = now
                self._lease_ends[lease.proxy] = max(self._lease_ends.get(lease.proxy, 0.0), lease.expires_at)

    def renewed(self, lease: LeaseRecord) -> None:
        with self._lock:
            self._lease_ends[lease.proxy] = max(self._lease_ends.get(lease.proxy, 0.0), lease.expires_at)

    def unmet(self, pool: str | None) -> None:
        if pool is None:
            return
        with self._lock:
            self._unmet.setdefault(pool, deque()).append(self._clock())

    def banned(self, proxy: str, client: str) -> None:
        with self._lock:
            self._bans.setdefault(proxy, {})[client] = self._clock()

    # --- read by the pools ------------------------------------------------------------------------------

    def unmet_within(self, pool: str, seconds: float) -> int:
        now = self._clock()
        with self._lock:
            times = self._unmet.get(pool, deque())
            while times and times[0] < now - KEEP_SECONDS:
                times.popleft()
            return sum(1 for t in times if t >= now - seconds)

    def observe(self, key: str, *, ban_window: float) -> Observed:
        now = self._clock()
        health = self.inventory.health(key).state
        with self._lock:
            since: float | None = None
            if health is HealthState.unhealthy:
                since = self._unhealthy_since.setdefault(key, now)
            else:
                self._unhealthy_since.pop(key, None)
            clients = {c for c, at in self._bans.get(key, {}).items() if at >= now - ban_window}
            return Observed(
                healthy=None if health is HealthState.unknown else health is HealthState.healthy,
                unhealthy_since=since,
                ban_clients=len(clients),
                last_leased=self._leased.get(key),
                leases_end=self._lease_ends.get(key),
            )

    def observer(self, pool: ProxyPool) -> Observe:
        """What the pool's decisions ask about each child (bans counted over the pool's own window)."""
        rule = pool.spec.rotation.replace_after_bans
        window = seconds(rule.window) if rule is not None else 0.0

        def observe(member: Member) -> Observed:
            return self.observe(member.key, ban_window=window)

        return observe

    def unmet_for(self, pool: ProxyPool) -> int:
        """Lease requests for the pool answered 503 within its demand window (0 without demand)."""
        if pool.spec.demand is None:
            return 0
        return self.unmet_within(pool.metadata.name, seconds(pool.spec.demand.window))

    def drain(self, key: str) -> None:
        self.inventory.drain(key)

    def forget(self, key: str) -> None:
        """A child is gone: drop what was counted about it."""
        self.inventory.undrain(key)
        with self._lock:
            for table in (self._bans, self._leased, self._lease_ends, self._unhealthy_since):
                table.pop(key, None)
