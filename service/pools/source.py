"""`PoolSource`: any `Source` plus its ProxyPools, each expanded into child Proxies.

The controller sees one source. Each poll passes the inner source's change through and adds the pools'
own: new or re-templated children as upserts, and the deletions a pool declares (scale-down, a drained
child after its replacement, a rolled-back replacement, every child of a pool removed from a complete
read). Those deletions pass the controller's deletion budget like any other; nothing else removes a child.

Membership is read back from the backend: `track()` receives the applied proxies, and those carrying the
pool label become children again (their labels record placement, birth and what they replace). No decision
is taken before the backend was read (`ready`), so a restart never doubles a pool.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from service.pools.expand import child_proxy, new_child
from service.pools.history import PoolHistory
from service.pools.hold import UNKNOWN_PROVIDER, unknown_providers
from service.pools.memory import Decision, PoolMemory
from service.pools.naming import Member, member_of
from service.pools.plan import decide
from service.pools.rotation import Observe
from service.pools.signals import PoolSignals
from service.pools.status import pool_status
from service.sources.contract import Source, SourceChange
from stacks.models import ProviderCatalogue, Proxy, ProxyPool, ProxyPoolStatus
from stacks.problems import Problem

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolRead:
    """The pools one read of the desired state found. `complete`: a pool absent from it is removed;
    `invalid`: pools whose document did not parse (their last version is kept)."""

    pools: dict[str, ProxyPool]
    complete: bool
    invalid: set[str] = field(default_factory=set)


class PoolSource:
    def __init__(
        self,
        inner: Source,
        *,
        read_pools: Callable[[SourceChange], PoolRead | None],
        signals: PoolSignals | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.inner = inner
        self.signals = signals
        self.history = PoolHistory()  # the last decisions, for the fleet page
        self.ready: Callable[[], bool] = lambda: True  # set by the wiring: the backend has been read
        self._read_pools = read_pools
        self._clock = clock
        self._rng = rng or random.Random()
        self._pools: dict[str, ProxyPool] = {}
        self._removed: set[str] = set()  # pools gone from a complete read: their children go
        self._children: dict[str, Member] = {}  # key -> live child
        self._leaving: dict[str, Proxy] = {}  # key -> child whose deletion the pool declared
        self._emitted: dict[str, Proxy] = {}
        self._strangers: set[str] = set()  # folder documents carrying a pool label (warned once)
        self.memory: dict[str, PoolMemory] = {}
        self.status: dict[str, ProxyPoolStatus] = {}

    # --- the Source protocol ----------------------------------------------------------------------------

    @property
    def problems(self) -> list[Problem]:
        return self.inner.problems

    @problems.setter
    def problems(self, value: list[Problem]) -> None:
        self.inner.problems = value

    @property
    def catalogue(self) -> ProviderCatalogue | None:
        return self.inner.catalogue

    def poll(self) -> SourceChange:
        change = self.inner.poll()
        self._disown(change)
        self._take(self._read_pools(change))
        if self.ready():
            for key in sorted(set(self._pools) | self._removed):
                self._step(key, change)
        return change

    def track(self, proxies: Iterable[Proxy]) -> None:
        rest: list[Proxy] = []
        declared = {p.key for p in self.inner.proxies()}
        for proxy in proxies:
            member = member_of(proxy)
            if member is None or proxy.key in declared:  # the folder declares it: not the pool's
                rest.append(proxy)
            elif proxy.key not in self._leaving:
                self._children.setdefault(proxy.key, member)
        self.inner.track(rest)

    def backend_loaded(self) -> None:
        self.inner.backend_loaded()

    def release(self, key: str) -> None:
        if self._leaving.pop(key, None) is None:
            self.inner.release(key)
            return
        self._emitted.pop(key, None)
        if self.signals is not None:
            self.signals.forget(key)

    def proxies(self) -> list[Proxy]:
        return [*self.inner.proxies(), *(m.proxy for m in self._children.values()), *self._leaving.values()]

    def credentials_for(self, proxy: Proxy) -> dict[str, str] | None:
        return self.inner.credentials_for(proxy)

    def secret_value(self, name: str, key: str) -> str | None:
        return self.inner.secret_value(name, key)

    # --- pools --------------------------------------------------------------------------------------------

    def pools(self) -> list[ProxyPool]:
        return [self._pools[k] for k in sorted(self._pools)]

    def children(self, pool_key: str) -> list[Member]:
        return sorted((m for m in self._children.values() if m.pool == pool_key), key=lambda m: m.name)

    def _disown(self, change: SourceChange) -> None:
        """A Proxy the folder declares is the folder's, whatever its labels: the pool generates no
        documents, so one carrying a pool label was written by hand (or copied). It is never a child."""
        for proxy in self.inner.proxies():
            member = member_of(proxy)
            if member is None:
                continue
            if self._children.pop(proxy.key, None) is not None:
                self._emitted.pop(proxy.key, None)
            if proxy.key not in self._strangers:
                self._strangers.add(proxy.key)
                log.warning(
                    "Proxy %s carries the label of pool %s but is not owned by it (a document of the folder: "
                    "the pool writes none): left alone; remove the label or delete it yourself",
                    proxy.key,
                    member.pool,
                    extra={"fields": {"pool": member.pool}},
                )
        self._strangers &= {p.key for p in self.inner.proxies()}

    def _take(self, read: PoolRead | None) -> None:
        if read is None:
            return
        for key, pool in read.pools.items():
            self._pools[key] = pool
            self._removed.discard(key)
        if read.complete:
            gone = set(self._pools) - set(read.pools) - read.invalid
            gone |= {m.pool for m in self._children.values()} - set(read.pools) - read.invalid
            for key in gone:
                self._pools.pop(key, None)
                self._removed.add(key)

    def _step(self, key: str, change: SourceChange) -> None:
        members = self.children(key)
        pool = self._pools.get(key)
        if pool is None:
            if key in self._removed:
                self._declare(members, change, why=f"pool {key} was removed")
                if not members:
                    self._removed.discard(key)
            return
        memory = self.memory.setdefault(key, PoolMemory())
        leaving = [m.name for m in map(member_of, self._leaving.values()) if m is not None and m.pool == key]
        decision = decide(
            pool,
            members=members,
            memory=memory,
            now=self._clock(),
            observe=self._observer(pool),
            unmet=self._unmet(pool),
            leaving=leaving,
            held=unknown_providers(pool, self.catalogue),
        )
        if decision.held is not None:  # nothing decided: the children stay as they are, not re-templated
            self._emit(pool, change, retemplate=False)
        else:
            self._apply(pool, members, decision, change)
        self._report(pool, memory, decision)

    def _observer(self, pool: ProxyPool) -> Observe | None:
        return self.signals.observer(pool) if self.signals is not None else None

    def _unmet(self, pool: ProxyPool) -> int:
        return self.signals.unmet_for(pool) if self.signals is not None else 0

    def _apply(
        self, pool: ProxyPool, members: list[Member], decision: Decision, change: SourceChange
    ) -> None:
        for name in decision.drain:
            if self.signals is not None:
                self.signals.drain(f"{pool.metadata.namespace}/{name}")
        by_name = {m.name: m for m in members}
        self._declare([by_name[n] for n in dict.fromkeys(decision.delete) if n in by_name], change, why="")
        for placement_key, replaces in decision.create:
            self._create(pool, placement_key, replaces=replaces)
        self._emit(pool, change)

    def _create(self, pool: ProxyPool, placement_key: str, *, replaces: str | None) -> None:
        leaving = [m for m in (member_of(p) for p in self._leaving.values()) if m is not None]
        proxy = new_child(
            pool,
            placement_key,
            replaces=replaces,
            others=[*self._children.values(), *leaving],
            rng=self._rng,
            born=self._clock(),
        )
        member = member_of(proxy) if proxy is not None else None
        if member is not None:
            self._children[member.key] = member

    def _emit(self, pool: ProxyPool, change: SourceChange, *, retemplate: bool = True) -> None:
        """Upsert each child as the pool's current template declares it, when that differs from before
        (a held pool's: as it is)."""
        placements = {p.key: p for p in pool.spec.placement} if retemplate else {}
        for member in self.children(pool.key):
            placement = placements.get(member.placement)
            proxy = member.proxy
            if placement is not None:
                proxy = child_proxy(
                    pool,
                    placement,
                    name=member.name,
                    born=member.born,
                    port=member.proxy.spec.port,
                    replaces=member.replaces,
                )
            if self._emitted.get(member.key) != proxy:
                self._emitted[member.key] = proxy
                self._children[member.key] = Member(
                    proxy=proxy,
                    pool=member.pool,
                    placement=member.placement,
                    born=member.born,
                    replaces=member.replaces,
                )
                change.upserts.append(proxy)

    def _declare(self, members: list[Member], change: SourceChange, *, why: str) -> None:
        for member in members:
            leaving = member.proxy.model_copy(deep=True)
            leaving.metadata.deletion_timestamp = datetime.fromtimestamp(self._clock(), UTC)
            self._children.pop(member.key, None)
            self._leaving[member.key] = leaving
            change.deletions.append(leaving)
            if why:
                log.info("%s: %s: its deletion is declared", member.key, why)

    def _report(self, pool: ProxyPool, memory: PoolMemory, decision: Decision) -> None:
        for event in decision.events:
            log.info("pool %s: %s", pool.key, event, extra={"fields": {"pool": pool.key}})
        self.history.record(pool.key, decision.events)
        inventory = self.signals.inventory if self.signals is not None else None
        status = pool_status(
            pool,
            members=self.children(pool.key),
            memory=memory,
            desired=decision.desired,
            healthy=(lambda key: inventory.health(key).healthy) if inventory is not None else None,
            held=decision.held,
        )
        before = self.status.get(pool.key)
        self.status[pool.key] = status
        if before is None or before.conditions != status.conditions:
            for c in status.conditions:
                log.log(
                    logging.WARNING if c.reason == UNKNOWN_PROVIDER else logging.INFO,
                    "pool %s: %s=%s (%s) %s",
                    pool.key,
                    c.type,
                    c.status,
                    c.reason,
                    c.message,
                )
