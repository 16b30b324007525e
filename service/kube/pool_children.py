"""A pool's children as the cluster shows them, and the bodies of the writes that make and follow a child.

The Kubernetes source's cache is the membership: a Proxy carrying the pool label is a child (a deleting one
is leaving and keeps its name and port taken). The cache lags a write by one watch event, so a child created
this term counts from what was sent until the cache shows it, and a child whose DELETE was sent is leaving
until the cache shows it deleting or gone: no pass doubles a pool or deletes a child twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pydantic import ValidationError

from service.kube.status_writer import merge_patch
from service.pools.expand import child_proxy
from service.pools.naming import Member, member_of
from service.sources.kubernetes import ProxyObject
from stacks.models import Proxy, ProxyPool

Obj = dict[str, Any]
PENDING_SECONDS = 120.0  # a created child no watch event showed by then is not counted any more


class ClusterChildren:
    def __init__(self, *, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._live: dict[str, Member] = {}
        self._leaving: dict[str, Member] = {}
        self._pending: dict[str, tuple[Member, float]] = {}  # created, not in the cache yet: since when
        self._deleted: set[str] = set()  # DELETE sent, the cache not showing it deleting yet

    def refresh(self, objects: Iterable[ProxyObject]) -> list[str]:
        """Take the cache's view; returns the children gone from it since the last refresh."""
        before = set(self._live) | set(self._leaving)
        live: dict[str, Member] = {}
        leaving: dict[str, Member] = {}
        for obj in objects:
            member = _member(obj)
            if member is None:
                continue
            if obj.deleting:
                self._deleted.discard(obj.key)
            (leaving if obj.deleting or obj.key in self._deleted else live)[obj.key] = member
        seen = set(live) | set(leaving)
        self._deleted &= seen
        now = self._clock()
        self._pending = {
            k: (m, at) for k, (m, at) in self._pending.items() if k not in seen and now - at < PENDING_SECONDS
        }
        self._live, self._leaving = live, leaving
        return sorted(before - seen)

    def members(self, pool_key: str) -> list[Member]:
        """The pool's children that count: live in the cache, or created and not shown yet."""
        found = [m for m in self._live.values() if m.pool == pool_key]
        found += [m for m, _ in self._pending.values() if m.pool == pool_key]
        return sorted(found, key=lambda m: m.name)

    def all(self) -> list[Member]:
        """Every child of every pool, leaving ones too (their names and ports are still taken)."""
        return [*self._live.values(), *self._leaving.values(), *(m for m, _ in self._pending.values())]

    def created(self, proxy: Proxy) -> None:
        member = member_of(proxy)
        if member is not None:
            self._pending[proxy.key] = (member, self._clock())

    def deleted(self, key: str) -> None:
        self._deleted.add(key)
        member = self._live.pop(key, None) or self._pending.pop(key, (None, 0.0))[0]
        if member is not None:
            self._leaving[key] = member


def _member(obj: ProxyObject) -> Member | None:
    try:
        return member_of(Proxy.model_validate(obj.body))
    except ValidationError:
        return None  # held by the source with its reason; the pool does not count it


def child_body(proxy: Proxy, *, owner: Obj) -> Obj:
    """The child Proxy to POST: its labels, annotations and spec, owned by the pool."""
    meta = proxy.metadata
    return {
        "apiVersion": proxy.api_version,
        "kind": proxy.kind,
        "metadata": {
            "name": meta.name,
            "namespace": meta.namespace,
            "labels": dict(meta.labels),
            "annotations": dict(meta.annotations),
            "ownerReferences": [owner],
        },
        "spec": proxy.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def retemplated(pool: ProxyPool, member: Member, body: Obj | None) -> Obj | None:
    """The merge patch that brings a child's spec and labels to the pool's current template, or None
    when they agree (compared as models: the apiserver's defaults are no difference)."""
    placement = next((p for p in pool.spec.placement if p.key == member.placement), None)
    if body is None or placement is None:
        return None
    want = child_proxy(
        pool,
        placement,
        name=member.name,
        born=member.born,
        port=member.proxy.spec.port,
        replaces=member.replaces,
    )
    have = member.proxy
    if have.spec == want.spec and have.metadata.labels == want.metadata.labels:
        return None
    return {
        "metadata": {"labels": merge_patch(dict(have.metadata.labels), dict(want.metadata.labels))},
        "spec": merge_patch(
            body.get("spec") or {}, want.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
        ),
    }
