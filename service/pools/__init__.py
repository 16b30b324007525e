"""Pools: a layer between a source and the controller that expands each ProxyPool into child Proxies.

`PoolSource` wraps any `Source`; below it everything is plain Proxies, stacks and hashes. The decisions
(spread, scale, rotation, replacement, rollback, demand) are pure functions in `plan.py`, fed with signals
(health, drain, bans, demand) gathered by `signals.py`. See docs/pools.md.
"""

from service.pools.signals import PoolSignals
from service.pools.source import PoolSource

__all__ = ["PoolSignals", "PoolSource"]
