"""Pools in a cluster: a ProxyPool's children are real Proxy objects, created and deleted through the API.

Run by the Lease holder, one instance per term (started and stopped with it, its memory with it). Each poll:
1. watchers keep the ProxyPools (spec, uid, status) and the Proxies carrying the pool label with their
   ownerReferences (the Kubernetes source's cache drops those);
2. once all were listed, a pool's children are the Proxies carrying its label *and* a controlling
   ownerReference to it, by uid (a deleting child is leaving and keeps its port taken), plus those this
   term created that the cache does not show yet. A Proxy with the label but not owned is a stranger: left
   alone (not counted, re-templated or deleted), a Warning Event on the pool names it;
3. a pool whose placement names a provider the catalogue lacks holds (service/pools/hold.py): nothing is
   created, deleted or patched, its status and a Warning Event say why; otherwise the same pure decision
   as the folder mode (`service/pools/plan.py`) says what to create, drain, delete;
4. a new child is POSTed with the pool as its controlling owner; a deletion is a DELETE of the child, which
   then takes the normal path (deletion timestamp behind our finalizer, the deletion budget, destroy,
   release); a child whose spec or labels differ from the template is merge-patched;
5. the pool's status is merge-patched only when it differs from what was last written or read.

A deleted pool takes its children with it through the garbage collector (owner references); this part never
deletes a child because a pool is absent from a list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes.client import ApiClient
from pydantic import ValidationError
from urllib3.exceptions import HTTPError as Urllib3Error

from service.kube.client import ApiException, request_json
from service.kube.pool_children import ClusterChildren, Owner, child_body, controlling_pool, retemplated
from service.kube.pool_events import PoolEvents
from service.kube.settings import KubeSettings
from service.kube.status_writer import MERGE_PATCH, keep_transition_times, merge_patch
from service.kube.watch import Obj, Watcher
from service.pools.expand import new_child
from service.pools.history import PoolHistory
from service.pools.hold import UNKNOWN_PROVIDER, unknown_providers
from service.pools.memory import Decision, PoolMemory
from service.pools.naming import POOL_LABEL, Member
from service.pools.plan import decide
from service.pools.signals import PoolSignals
from service.pools.status import pool_status
from service.sources.kubernetes import KubernetesSource, ProxyObject, proxy_object
from stacks.models import API_VERSION, POOL_KIND, ProxyPool, ProxyPoolStatus

__all__ = ["ClusterPools"]

log = logging.getLogger(__name__)

POOLS = "proxypools"
BASE = f"/apis/{API_VERSION}"
NOT_FOUND, CONFLICT = 404, 409


class ClusterPools:
    def __init__(
        self,
        api: ApiClient,
        kube: KubeSettings,
        *,
        source: KubernetesSource,
        signals: PoolSignals,
        history: PoolHistory | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.api, self.source, self.signals = api, source, signals
        self.history = history or PoolHistory()  # the last decisions (the fleet page), across terms
        self._clock = clock
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._pools: dict[str, Obj] = {}
        self.children = ClusterChildren(clock=clock)
        self.memory: dict[str, PoolMemory] = {}
        self._kids: dict[str, tuple[ProxyObject, Owner | None]] = {}  # Proxies with the pool label
        self.events = PoolEvents(api)
        self._warned: set[str] = set()  # strangers already named (logged and an Event) while they last
        self._written: dict[str, Obj] = {}  # pool uid -> the status last written
        self.writes = 0  # API writes sent (creates, deletes, patches): tests, logs
        paths = [f"{BASE}/namespaces/{ns}/{POOLS}" for ns in kube.namespaces] or [f"{BASE}/{POOLS}"]
        self.watchers = [
            Watcher(
                api, path, on_list=self._lister(path), on_event=self._event, slim=_slim, name=f"pools {path}"
            )
            for path in paths
        ]
        proxies = [f"{BASE}/namespaces/{ns}/proxies" for ns in kube.namespaces] or [f"{BASE}/proxies"]
        self.watchers += [
            Watcher(
                api,
                path,
                on_list=self._kids_lister(path),
                on_event=self._kid_event,
                slim=lambda raw: (proxy_object(raw), controlling_pool(raw)),
                label_selector=POOL_LABEL,
                name=f"pool children {path}",
            )
            for path in proxies
        ]

    def start(self) -> None:
        for watcher in self.watchers:
            watcher.start()

    def stop(self) -> None:
        for watcher in self.watchers:
            watcher.stop()

    def synced(self) -> bool:
        return self.source.desired_state_synced() and all(w.synced.is_set() for w in self.watchers)

    def statuses(self) -> dict[str, ProxyPoolStatus]:
        """Each pool's status as last written (or read), by `namespace/name`: the fleet page's pools."""
        with self._lock:
            pools = dict(self._pools)
            written = dict(self._written)
        found = {}
        for key, raw in pools.items():
            uid = str((raw.get("metadata") or {}).get("uid") or "")
            with contextlib.suppress(ValidationError):
                found[key] = ProxyPoolStatus.model_validate(written.get(uid) or raw.get("status") or {})
        return found

    async def run(self, stop: asyncio.Event, *, every: float) -> None:
        """A pass every `every` seconds until `stop` (the term's end)."""
        while not stop.is_set():
            await asyncio.to_thread(self.step)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=every)

    # --- one pass -----------------------------------------------------------------------------------------

    def step(self) -> None:
        """One pass over every pool; a pool whose writes fail is tried again on the next pass."""
        if not self.synced():
            return
        with self._lock:
            pools = dict(self._pools)
            kids = dict(self._kids)
        uids = {key: str(raw["metadata"].get("uid") or "") for key, raw in pools.items()}
        objects = [obj for obj, _ in kids.values()]
        owners = {key: owner for key, (_, owner) in kids.items()}
        for gone in self.children.refresh(objects, owners=owners, pools=uids):
            self.signals.forget(gone)
        strangers = self.children.strangers
        for stranger, pool_key in sorted(strangers.items()):
            if stranger in self._warned:
                continue
            message = (
                f"Proxy {stranger} carries the label of pool {pool_key} but is not owned by it: left alone; "
                "remove the label or delete it yourself"
            )
            log.warning("%s", message, extra={"fields": {"pool": pool_key}})
            self.events.warn(pools[pool_key], "NotOwned", message)
        self._warned = set(strangers)
        for key in sorted(pools):
            try:
                self._step_pool(pools[key])
            except ApiException as exc:
                log.warning("pool %s: %s %s (tried again)", key, exc.status, exc.reason)
            except (Urllib3Error, OSError, ValueError) as exc:  # ValueError: no free port for a child
                log.warning("pool %s: %s (tried again)", key, exc)

    def _step_pool(self, raw: Obj) -> None:
        try:
            pool = ProxyPool.model_validate({**raw, "status": {}})
        except ValidationError as exc:
            log.warning("ProxyPool %s is not valid, left as it is: %s", _key(raw), exc.errors()[:3])
            return
        members = self.children.members(pool.key)
        memory = self.memory.setdefault(pool.key, PoolMemory())
        now = self._clock()
        decision = decide(
            pool,
            members=members,
            memory=memory,
            now=now,
            observe=self.signals.observer(pool),
            unmet=self.signals.unmet_for(pool),
            leaving=self.children.leaving(pool.key),
            held=unknown_providers(pool, self.source.catalogue),
        )
        for event in decision.events:
            log.info("pool %s: %s", pool.key, event, extra={"fields": {"pool": pool.key}})
        self.history.record(pool.key, decision.events)
        if decision.held is not None:  # nothing created, deleted or patched: the children run on
            log.warning("pool %s: %s", pool.key, decision.held, extra={"fields": {"pool": pool.key}})
            self.events.warn(raw, UNKNOWN_PROVIDER, decision.held)
        else:
            self._apply(pool, raw, members, decision)
            members = self.children.members(pool.key)
            self._retemplate(pool, members)
        self._write_status(pool, raw, members, memory, decision)

    def _apply(self, pool: ProxyPool, raw: Obj, members: list[Member], decision: Decision) -> None:
        for name in decision.drain:
            self.signals.drain(f"{pool.metadata.namespace}/{name}")
        by_name = {m.name: m for m in members}
        for name in dict.fromkeys(decision.delete):
            if name in by_name:
                self._delete(by_name[name])
        for placement_key, replaces in decision.create:
            proxy = new_child(
                pool,
                placement_key,
                replaces=replaces,
                others=self.children.all(),
                rng=self._rng,
                born=self._clock(),
            )
            if proxy is not None and self._create(pool, child_body(proxy, owner=_owner(raw)), proxy.key):
                self.children.created(proxy)

    # --- writes ---------------------------------------------------------------------------------------------

    def _create(self, pool: ProxyPool, body: Obj, key: str) -> bool:
        path = f"{BASE}/namespaces/{pool.metadata.namespace}/proxies"
        try:
            request_json(self.api, "POST", path, body=body, timeout=(5, 30))
        except ApiException as exc:
            if exc.status != CONFLICT:
                raise
            return False  # the name is taken (a Proxy of no pool): the next pass draws another
        self.writes += 1
        log.info("pool %s: created %s", pool.key, key, extra={"fields": {"pool": pool.key}})
        return True

    def _delete(self, member: Member) -> None:
        namespace, name = member.key.split("/", 1)
        try:
            request_json(self.api, "DELETE", f"{BASE}/namespaces/{namespace}/proxies/{name}", timeout=(5, 30))
        except ApiException as exc:
            if exc.status != NOT_FOUND:
                raise
        self.writes += 1
        self.children.deleted(member.key)
        log.info("pool %s: deleted %s", member.pool, member.key, extra={"fields": {"pool": member.pool}})

    def _retemplate(self, pool: ProxyPool, members: list[Member]) -> None:
        """A template edit reaches every child: its spec and labels merge-patched (proxies patch)."""
        for member in members:
            with self._lock:
                seen = self._kids.get(member.key)
            patch = retemplated(pool, member, seen[0].body if seen is not None else None)
            if patch is None:
                continue
            namespace, name = member.key.split("/", 1)
            path = f"{BASE}/namespaces/{namespace}/proxies/{name}"
            request_json(self.api, "PATCH", path, body=patch, content_type=MERGE_PATCH, timeout=(5, 30))
            self.writes += 1
            log.info("pool %s: %s follows the template", pool.key, member.key)

    def _write_status(
        self, pool: ProxyPool, raw: Obj, members: list[Member], memory: PoolMemory, decision: Decision
    ) -> None:
        inventory = self.signals.inventory
        status = pool_status(
            pool,
            members=members,
            memory=memory,
            desired=decision.desired,
            healthy=lambda key: inventory.health(key).healthy,
            held=decision.held,
        )
        uid = str(raw["metadata"].get("uid") or "")
        base: Obj = self._written.get(uid) or raw.get("status") or {}
        rendered = keep_transition_times(
            status.model_dump(mode="json", by_alias=True, exclude_none=True), base
        )
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        for condition in rendered.get("conditions") or []:
            condition.setdefault("lastTransitionTime", now)
        if rendered == base:
            return
        path = f"{BASE}/namespaces/{pool.metadata.namespace}/{POOLS}/{pool.metadata.name}/status"
        request_json(
            self.api,
            "PATCH",
            path,
            body={"status": merge_patch(base, rendered)},
            content_type=MERGE_PATCH,
            timeout=(5, 30),
        )
        self.writes += 1
        self._written[uid] = rendered

    # --- the watch (its thread) -----------------------------------------------------------------------------

    def _lister(self, path: str) -> Callable[[list[Obj]], None]:
        namespace = path.split("/namespaces/")[1].split("/")[0] if "/namespaces/" in path else None

        def on_list(items: list[Obj]) -> None:
            with self._lock:
                for key in [k for k in self._pools if namespace is None or k.startswith(f"{namespace}/")]:
                    del self._pools[key]
                self._pools.update({_key(obj): obj for obj in items})

        return on_list

    def _event(self, kind: str, obj: Obj) -> None:
        with self._lock:
            if kind == "DELETED":
                self._pools.pop(_key(obj), None)
            else:
                self._pools[_key(obj)] = obj

    def _kids_lister(self, path: str) -> Callable[[list[tuple[ProxyObject, Owner | None]]], None]:
        namespace = path.split("/namespaces/")[1].split("/")[0] if "/namespaces/" in path else None

        def on_list(items: list[tuple[ProxyObject, Owner | None]]) -> None:
            with self._lock:
                for key in [k for k in self._kids if namespace is None or k.startswith(f"{namespace}/")]:
                    del self._kids[key]
                self._kids.update({obj.key: (obj, owner) for obj, owner in items})

        return on_list

    def _kid_event(self, kind: str, item: tuple[ProxyObject, Owner | None]) -> None:
        with self._lock:
            if kind == "DELETED":
                self._kids.pop(item[0].key, None)
            else:
                self._kids[item[0].key] = item


def _slim(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    kept = {
        k: meta[k] for k in ("name", "namespace", "uid", "generation", "labels", "annotations") if k in meta
    }
    return {
        "apiVersion": API_VERSION,
        "kind": POOL_KIND,
        "metadata": kept,
        "spec": obj.get("spec") or {},
        "status": obj.get("status") or {},
    }


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _owner(raw: Obj) -> dict[str, Any]:
    """The pool as its children's controlling owner. blockOwnerDeletion stays false: it would need
    `update` on proxypools/finalizers, and our own finalizer on each child already holds its deletion."""
    meta = raw["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": POOL_KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": False,
    }
