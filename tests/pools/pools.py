"""Helpers of the pool tests: pool documents, members at given ages, a signals double made of plain data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from service.pools.expand import child_proxy
from service.pools.memory import Observed
from service.pools.naming import Member, member_of
from stacks.models import ProxyPool


def pool_doc(
    name: str = "eu", *, replicas: int = 6, providers: tuple[str, ...] = ("a", "b"), **spec: Any
) -> dict[str, Any]:
    placement = spec.pop("placement", [{"provider": p} for p in providers])
    template_spec = {"allowedSourceRanges": ["127.0.0.0/8"], **spec.pop("template_spec", {})}
    return {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "ProxyPool",
        "metadata": {"name": name, "namespace": "crawl"},
        "spec": {"replicas": replicas, "placement": placement, "template": {"spec": template_spec}, **spec},
    }


def pool(name: str = "eu", **kwargs: Any) -> ProxyPool:
    return ProxyPool.model_validate(pool_doc(name, **kwargs))


def member(
    p: ProxyPool, name: str, *, placement: str = "a", born: float = 0.0, replaces: str | None = None
) -> Member:
    where = next(x for x in p.spec.placement if x.key == placement)
    proxy = child_proxy(p, where, name=name, born=born, port=3128, replaces=replaces)
    found = member_of(proxy)
    assert found is not None
    return found


@dataclass
class Signals:
    """Observations by child name; unknown children are healthy and never leased."""

    seen: dict[str, Observed] = field(default_factory=dict)

    def __call__(self, m: Member) -> Observed:
        return self.seen.get(m.name, Observed(healthy=True))
