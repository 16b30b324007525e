"""A pool's shape: how many children each placement gets, and a child Proxy built from the template."""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable

from service.pools.naming import (
    BORN_LABEL,
    PLACEMENT_LABEL,
    POOL_LABEL,
    REPLACES_LABEL,
    Member,
    child_name,
    new_token,
)
from stacks.models import ObjectMeta, PoolPlacement, Proxy, ProxyPool, ProxySpec

PORT_SEARCH = 1000  # how far above portBase a local child looks for a free port


def spread(placement: list[PoolPlacement], replicas: int) -> dict[str, int]:
    """Fixed `count`s first, the rest by weight (default 1), largest remainder, ties in listed order."""
    counts = {p.key: p.count or 0 for p in placement}
    rest = max(replicas - sum(counts.values()), 0)
    weighted = [p for p in placement if p.count is None]
    total = sum(1 if p.weight is None else p.weight for p in weighted)
    if not weighted or total == 0:
        return counts
    shares = [(rest * (1 if p.weight is None else p.weight) / total, i, p) for i, p in enumerate(weighted)]
    for share, _, p in shares:
        counts[p.key] = int(share)
    left = rest - sum(int(share) for share, _, _ in shares)
    by_remainder = sorted(shares, key=lambda s: (-(s[0] - int(s[0])), s[1]))
    for _, _, p in by_remainder[:left]:
        counts[p.key] += 1
    return counts


def child_port(pool: ProxyPool, placement: PoolPlacement, *, used: Collection[int]) -> int:
    """The template's port, or on a shared host (portBase set) the first port from portBase not in use."""
    if placement.port_base is None:
        return pool.spec.template.spec.port
    for port in range(placement.port_base, min(placement.port_base + PORT_SEARCH, 65536)):
        if port not in used:
            return port
    raise ValueError(f"pool {pool.key}: no free port from {placement.port_base} for {placement.key}")


def child_proxy(
    pool: ProxyPool, placement: PoolPlacement, *, name: str, born: float, port: int, replaces: str | None
) -> Proxy:
    """The child as the pool's current template declares it (a template edit reaches every child)."""
    template = pool.spec.template
    body = template.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    body.update(provider=placement.provider, port=port)
    body.setdefault("pool", pool.metadata.name)
    if placement.zone is not None and "gcp" in body:  # a zone reaches gcp children; others keep it as a label
        body["gcp"]["zone"] = placement.zone
    labels = {
        **template.metadata.labels,
        POOL_LABEL: pool.metadata.name,
        PLACEMENT_LABEL: placement.key,
        BORN_LABEL: str(int(born)),
    }
    if replaces is not None:
        labels[REPLACES_LABEL] = replaces
    meta = ObjectMeta(
        name=name,
        namespace=pool.metadata.namespace,
        labels=labels,
        annotations=dict(template.metadata.annotations),
    )
    return Proxy(metadata=meta, spec=ProxySpec.model_validate(body))


def new_child(
    pool: ProxyPool,
    placement_key: str,
    *,
    replaces: str | None,
    others: Iterable[Member],
    rng: random.Random,
    born: float,
) -> Proxy | None:
    """A new child on `placement_key` (None: that placement is gone from the spec): a fresh name, and on
    a shared host the first port no other child on that provider holds (`others`: leaving ones too, a
    port is free only once its process is gone)."""
    placement = next((p for p in pool.spec.placement if p.key == placement_key), None)
    if placement is None:
        return None
    others = list(others)
    used = {m.proxy.spec.port for m in others if m.proxy.spec.provider == placement.provider}
    names = {m.name for m in others}
    meta = pool.metadata
    name = child_name(pool=meta.name, namespace=meta.namespace, token=new_token(rng))
    while name in names:
        name = child_name(pool=meta.name, namespace=meta.namespace, token=new_token(rng))
    port = child_port(pool, placement, used=used)
    return child_proxy(pool, placement, name=name, born=born, port=port, replaces=replaces)
