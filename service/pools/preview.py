"""What `preview` shows of the pools: the children applying the manifests would create, keep and delete.

The expansion is the one-shot `up`'s (shape only: no rotation, no demand) on the backend's applied proxies,
so a pool already applied keeps its children and only the difference shows. A new child's name is drawn at
random here and again at apply: the preview shows how many go where, not the names they will get.
"""

from __future__ import annotations

from automation.preview_model import PoolChild, PoolPreview
from service.pools.naming import member_of
from service.pools.source import PoolSource
from service.pools.wiring import pooled_directory
from service.sources.contract import SourceChange
from service.sources.directory import DirectorySource
from stacks.models import Proxy


def expand_for_preview(
    source: DirectorySource, *, applied: list[Proxy]
) -> tuple[PoolSource, SourceChange, list[PoolPreview]]:
    """The folder with its pools expanded over `applied`; its first read; and each pool's children."""
    pooled = pooled_directory(source, inventory=None)
    pooled.track(applied)
    change = pooled.poll()
    known = {proxy.key for proxy in applied}
    previews = []
    for pool in pooled.pools():
        children = [
            PoolChild(name=m.name, placement=m.placement, change="keep" if m.key in known else "create")
            for m in pooled.children(pool.key)
        ]
        leaving = [m for m in map(member_of, change.deletions) if m is not None and m.pool == pool.key]
        children += [PoolChild(name=m.name, placement=m.placement, change="delete") for m in leaving]
        status = pooled.status.get(pool.key)
        previews.append(
            PoolPreview(
                pool=pool.key,
                desired=status.desired if status is not None else pool.spec.replicas,
                children=sorted(children, key=lambda c: (c.placement, c.change, c.name)),
            )
        )
    return pooled, change, previews


def declared(pooled: PoolSource) -> list[Proxy]:
    """The proxies the expanded folder declares: children the pool lets go are left out (absent)."""
    return [proxy for proxy in pooled.proxies() if proxy.metadata.deletion_timestamp is None]
