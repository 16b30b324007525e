"""Putting pools between a directory source and the controller, and discovery's observer on them."""

from __future__ import annotations

import time
from collections.abc import Callable

from service.discovery.service import DiscoveryService
from service.inventory import Inventory
from service.pools.signals import PoolSignals
from service.pools.source import PoolRead, PoolSource
from service.sources.contract import Source, SourceChange
from service.sources.directory import DirectorySource
from stacks.models import POOL_KIND


def directory_pools(source: DirectorySource) -> Callable[[SourceChange], PoolRead | None]:
    """The ProxyPool documents of each new load of the folder, complete when that load was."""
    seen: list[object] = [None]

    def read(change: SourceChange) -> PoolRead | None:
        found = source.manifest_set
        if found is None or found is seen[0]:
            return None
        seen[0] = found
        invalid = {
            (p.obj or "").removeprefix(f"{POOL_KIND} ")
            for p in found.problems
            if (p.obj or "").startswith(f"{POOL_KIND} ")
        }
        pools = {located.obj.key: located.obj for located in found.pools}
        return PoolRead(pools=pools, complete=change.complete, invalid=invalid)

    return read


def pooled_directory(
    source: DirectorySource,
    *,
    inventory: Inventory | None,
    clock: Callable[[], float] = time.time,
) -> PoolSource:
    """A directory source with its pools. With an inventory (`serve`), pools rotate, replace and follow
    demand from its health and discovery's signals; without one (a one-shot `up`) they only keep their
    shape: nothing probes there, so no replacement could ever become healthy."""
    signals = PoolSignals(inventory, clock=clock) if inventory is not None else None
    return PoolSource(source, read_pools=directory_pools(source), signals=signals, clock=clock)


def attach_discovery(source: Source, discovery: DiscoveryService) -> None:
    """Discovery reports hand-outs, unmet requests and ban reports to the pools' signals."""
    if isinstance(source, PoolSource) and source.signals is not None:
        discovery.observer = source.signals
