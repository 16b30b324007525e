"""A pool's children as the cluster shows them, and the bodies of the writes that make and follow a child.

Membership is the pool's ownerReference: a child is a Proxy carrying the pool label *and* a controlling
ownerReference to that ProxyPool (its name and uid); a deleting one is leaving and keeps its name and port
taken. A Proxy with the label but without that reference is a stranger (`strangers`): never counted,
re-templated or deleted (made by hand, or owned by an earlier pool of the same name). The cache lags a
write by one watch event, so a child created this term counts from what was sent until the cache shows
it, and a child whose DELETE was sent is leaving until the cache shows it deleting or gone: no pass
doubles a pool or deletes a child twice. Each refresh validates only the Proxies whose body changed since
the one before (a model per child was validated every pass, every second, 10,000 of them in a large pool).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from service.kube.status_writer import merge_patch
from service.pools.expand import child_proxy
from service.pools.naming import Member, member_of
from service.sources.kubernetes import ProxyObject
from stacks.models import API_VERSION, POOL_KIND, Proxy, ProxyPool

Obj = dict[str, Any]
API_GROUP = API_VERSION.split("/", 1)[0]
Owner = tuple[str, str]  # the controlling ProxyPool ownerReference: (name, uid)
Judged = dict[str, tuple[ProxyObject, Member | None]]  # key -> (the last copy seen, its membership)
PENDING_SECONDS = 120.0  # a created child no watch event showed by then is not counted any more


class ClusterChildren:
    def __init__(self, *, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._live: dict[str, Member] = {}
        self._leaving: dict[str, Member] = {}
        self._pending: dict[str, tuple[Member, float]] = {}  # created, not in the cache yet: since when
        self._deleted: set[str] = set()  # DELETE sent, the cache not showing it deleting yet
        self._strangers: dict[str, Member] = {}  # carrying a pool's label, not owned by it
        self._judged: Judged = {}
        self.validated = 0  # bodies validated so far (tests)

    def refresh(
        self,
        objects: Iterable[ProxyObject],
        *,
        owners: Mapping[str, Owner | None],
        pools: Mapping[str, str],
    ) -> list[str]:
        """Take the cache's view; returns the children gone from it since the last refresh.

        `owners`: each Proxy's controlling ProxyPool owner (name, uid), None without one; `pools`: the
        uid of each pool listed (ns/name -> uid)."""
        before = set(self._live) | set(self._leaving)
        live: dict[str, Member] = {}
        leaving: dict[str, Member] = {}
        strangers: dict[str, Member] = {}
        judged: Judged = {}
        for obj in objects:
            member = self._member(obj, judged)
            if member is None:
                continue
            uid = pools.get(member.pool)
            if uid is None:
                continue  # its pool is not listed: counted by no pool (the garbage collector's)
            name = member.pool.split("/", 1)[1]
            if owners.get(obj.key) != (name, uid):
                strangers[obj.key] = member
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
        self._live, self._leaving, self._strangers = live, leaving, strangers
        self._judged = judged
        return sorted(before - seen)

    def _member(self, obj: ProxyObject, judged: Judged) -> Member | None:
        """Its membership, validated again only when its body changed since the last refresh."""
        known = self._judged.get(obj.key)
        if known is None or not known[0].same_body(obj):
            self.validated += 1
            known = (obj, _member(obj))
        elif known[0] is not obj:
            known = (obj, known[1])  # the cache's copy: an older one is not kept alive here
        judged[obj.key] = known
        return known[1]

    def members(self, pool_key: str) -> list[Member]:
        """The pool's children that count: live in the cache, or created and not shown yet."""
        found = [m for m in self._live.values() if m.pool == pool_key]
        found += [m for m, _ in self._pending.values() if m.pool == pool_key]
        return sorted(found, key=lambda m: m.name)

    @property
    def strangers(self) -> dict[str, str]:
        """Proxy key -> the pool whose label it carries without being owned by it."""
        return {key: m.pool for key, m in self._strangers.items()}

    def leaving(self, pool_key: str) -> list[str]:
        """Names of the pool's children whose deletion was sent and that are not gone yet."""
        return sorted(m.name for m in self._leaving.values() if m.pool == pool_key)

    def all(self) -> list[Member]:
        """Every child of every pool, leaving ones and strangers too (their names and ports are taken)."""
        return [
            *self._live.values(),
            *self._leaving.values(),
            *(m for m, _ in self._pending.values()),
            *self._strangers.values(),
        ]

    def created(self, proxy: Proxy) -> None:
        member = member_of(proxy)
        if member is not None:
            self._pending[proxy.key] = (member, self._clock())

    def deleted(self, key: str) -> None:
        self._deleted.add(key)
        member = self._live.pop(key, None) or self._pending.pop(key, (None, 0.0))[0]
        if member is not None:
            self._leaving[key] = member


def controlling_pool(raw: Obj) -> Owner | None:
    """The (name, uid) of the ProxyPool an object's controlling ownerReference names, None without one."""
    for ref in (raw.get("metadata") or {}).get("ownerReferences") or []:
        group = str(ref.get("apiVersion") or "").split("/", 1)[0]
        if (
            group == API_GROUP
            and ref.get("kind") == POOL_KIND
            and ref.get("controller") is True
            and ref.get("uid")
        ):
            return str(ref.get("name") or ""), str(ref["uid"])
    return None


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
