"""Proxy objects in a Kubernetes API server as the source of desired state.

The watched copy (`service.kube.cluster_cache`) keeps every Proxy, the catalogue ConfigMap and the
credentials Secrets; `poll` judges what changed since the last poll into a `SourceChange`, under the same
contract as the directory source:

- A deletion is declared only by the object itself: a deletion timestamp (behind our finalizer
  `crawl.example.com/cleanup`), or a DELETED event. Absence from a list is never a deletion: an applied proxy
  that no list shows is held (`ProxyNotFound`) and keeps running.
- Nothing destructive before the backend is read: until the control loop says the backend's stacks were
  read (`backend_loaded`, again at each new term), a deleting Proxy the source does not know is left as it
  is (its finalizer stays): it may be applied in a stack.
- What a deletion removes is decided with the live object's annotations (skip-cleanup forgets), and a
  change to them while the Proxy is deleting is passed on again.
- A Proxy the model refuses (the CRD let it through) is held with its reason; its last valid version stays.
- `crawl.example.com/paused: "true"` freezes a Proxy at the version last passed on (held, `Paused`);
  deleting a paused Proxy still proceeds. A new value of `crawl.example.com/reconcile-requested-at` asks
  for a run of its stack (`SourceChange.requested`).
- With `writes` on (the leader), the finalizer is added to each live Proxy, and removed by `release` once
  its resources are gone or forgotten (`service.kube.finalizers`). Followers only read.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from datetime import UTC, datetime

import yaml
from kubernetes.client import ApiClient
from pydantic import ValidationError

from service.kube.cluster_cache import CREDENTIALS_LABEL, ClusterCache
from service.kube.finalizers import FinalizerWriter
from service.kube.proxy_object import (
    FINALIZER,
    PAUSED,
    RECONCILE_REQUESTED,
    SKIP_CLEANUP,
    ProxyObject,
    proxy_object,
    slim_proxy,
)
from service.kube.settings import KubeSettings
from service.kube.watch import Watcher
from service.sources.contract import Hold, Lane, SourceChange
from stacks.catalogue import CatalogueFormatError, parse_catalogue
from stacks.models import PackedProxy, ProviderCatalogue, Proxy
from stacks.models.conditions import Reason
from stacks.problems import Problem

log = logging.getLogger(__name__)

LANE_MOST = 64  # changed Proxies a new term takes in first; with more (a first intake) there is no lane

__all__ = [
    "CREDENTIALS_LABEL",
    "FINALIZER",
    "PAUSED",
    "RECONCILE_REQUESTED",
    "KubernetesSource",
    "ProxyObject",
    "proxy_object",
    "slim_proxy",
]


class KubernetesSource:
    def __init__(self, api: ApiClient, settings: KubeSettings, *, writes: bool = False) -> None:
        self.api = api
        self.settings = settings
        self.writes = writes  # the leader adds and removes finalizers; followers only read
        self.problems: list[Problem] = []
        self.cache = ClusterCache(api, settings)
        self.cache.fresh_wanted = writes
        self.finalizers = FinalizerWriter(api, writes=lambda: self.writes)
        # The version last passed on (what the planner knows), packed: one per Proxy, 10,000 at once.
        self._emitted: dict[str, PackedProxy] = {}
        self._secret_of: dict[str, str] = {}  # key -> the Secret its emitted version names
        self._leaving: set[str] = set()  # deletions passed on, not released yet
        self._tracked: dict[str, PackedProxy] = {}  # applied in the backend
        self._backend_read = False  # the control loop read the backend's stacks (this term)
        self._deferred: set[str] = set()  # deletions seen before that: judged again after it
        self._holds: dict[str, Hold] = {}
        self._requested: dict[str, str] = {}  # key -> last reconcile-requested-at seen
        self._catalogue: ProviderCatalogue | None = None
        self._catalogue_seen = False

    # --- lifecycle --------------------------------------------------------------------------------------

    @property
    def watchers(self) -> list[Watcher]:
        return self.cache.watchers

    @property
    def on_change(self) -> Callable[[], None]:
        return self.cache.on_change

    @on_change.setter
    def on_change(self, callback: Callable[[], None]) -> None:
        self.cache.on_change = callback

    def start(self) -> None:
        self.cache.start()
        self.finalizers.start()

    def stop(self) -> None:
        self.cache.stop()
        self.finalizers.stop()

    def synced(self) -> bool:
        return self.cache.synced()

    def desired_state_synced(self) -> bool:
        return self.cache.desired_state_synced()

    def wait_synced(self, timeout: float) -> bool:
        """Wait for the first list of Proxies and the catalogue (see ClusterCache.desired_state_synced)."""
        return self.cache.wait_synced(timeout)

    def watch_errors(self) -> list[str]:
        return self.cache.watch_errors()

    def replay(self) -> None:
        """Forget what was passed on: the next poll passes on everything again (the catalogue, every
        Proxy, every deletion in progress) for a new control loop that knows nothing yet (a new term),
        and nothing destructive is decided until that loop has read the backend again."""
        self.cache.mark(relisted=True, catalogue=True)
        self._catalogue = None
        self._emitted.clear()
        self._secret_of.clear()
        self._leaving.clear()
        self._tracked.clear()
        self._holds.clear()
        self._backend_read = False
        self._deferred.clear()

    def set_writes(self, writes: bool) -> None:
        """Leading or not: a new leader adds the finalizers its predecessor may not have added yet."""
        self.writes = writes
        self.cache.fresh_wanted = writes
        if writes:
            self.cache.mark()
        else:
            self.cache.take_fresh()  # a follower takes no lane

    # --- the Source contract ----------------------------------------------------------------------------

    @property
    def catalogue(self) -> ProviderCatalogue | None:
        return self._catalogue

    def poll(self) -> SourceChange:
        return self.poll_some()[0]

    def poll_some(
        self, *, limit: int | None = None, only: Collection[str] | None = None
    ) -> tuple[SourceChange, bool]:
        """`poll`, judging at most `limit` of the changed Proxies (and of those only the keys in `only`); the
        rest stay marked for the next call, as if their events came later. Returns the change and whether
        some are left. The control loop judges 10,000 in slices so that its event loop keeps serving."""
        change = SourceChange()
        if not self.desired_state_synced():
            change.complete = False
            return change, False
        marks = self.cache.take()
        dirty, objects = marks.dirty, marks.objects
        if only is not None or (limit is not None and len(dirty) > limit):
            chosen = sorted(dirty if only is None else dirty & set(only))[:limit]
            left = dirty.difference(chosen)
            if left:
                self.cache.mark(left)  # judged at a later call
            dirty = set(chosen)
        else:
            left = set()
        if marks.catalogue_dirty or not self._catalogue_seen:
            self._take_catalogue(change)
        for key in sorted(dirty):
            self._judge(key, objects.get(key), change)
        if marks.relisted or dirty:
            for key in sorted(set(self._tracked) - set(objects) - set(self._emitted)):
                change.held[key] = _not_found(key)
        if marks.secrets_dirty:
            change.requested |= {key for key, ref in self._secret_of.items() if ref in marks.secrets_dirty}
        upserted = set(change.upserts.keys())
        for key in dirty - set(change.held):
            # Judged again and no longer held (resumed, fixed): passed on again even if unchanged, so the
            # control loop sees the hold end.
            if self._holds.pop(key, None) is not None and key in self._emitted and key not in upserted:
                change.upserts.append(self._emitted[key])
        for key, hold in change.held.items():
            self._holds[key] = hold
        for key in set(self._holds) - set(change.held) - dirty:
            change.held.setdefault(key, self._holds[key])  # still held: the loop reports the set each time
        self.problems = change.problems or self.problems
        return change, bool(left)

    def urgent(self) -> Lane | None:
        """A lane for the changes that watch events brought since the last call (see `lane`): a change
        made while a new term judges the bulk goes ahead of what is left of it."""
        fresh = self.cache.take_fresh()
        return self.lane(among=fresh) if fresh else None

    def lane(self, *, most: int = LANE_MOST, among: Collection[str] | None = None) -> Lane | None:
        """The Proxies a new term takes in ahead of the rest: the few with a real change (a generation that
        their status does not describe yet), and every Proxy of the stacks those go to, so that those
        stacks can run once they are read, before the bulk is judged. None when there is no catalogue, no
        such change, or more than `most` of them (a first intake: no lane); `among` limits the changed
        ones to those keys (the ones watch events brought: `urgent`). A changed Proxy whose flat name
        another object shares is left to the bulk (which of the two keeps the name needs the whole fleet
        and the backend's record of which is applied)."""
        catalogue = self._catalogue
        if catalogue is None:
            return None
        if among is None:
            self.cache.take_fresh()  # what this lane sees needs no lane of its own later
        objects = self.cache.objects()
        candidates = objects if among is None else [o for o in (self.cache.object(k) for k in among) if o]
        changed = [
            obj for obj in candidates if not obj.deleting and obj.observed_generation != obj.generation
        ]
        if not changed or len(changed) > most:
            return None
        flat_names = Counter(obj.key.replace("/", "-", 1) for obj in objects)
        stacks: set[str] = set()
        keys: set[str] = set()
        for obj in changed:
            provider = (obj.body.get("spec") or {}).get("provider")
            if not isinstance(provider, str) or catalogue.get(provider) is None:
                continue
            if flat_names[obj.key.replace("/", "-", 1)] > 1:
                continue
            stacks.add(provider)
            keys.add(obj.key)
        if not stacks:
            return None
        # The stacks' other Proxies: unchanged ones say where they run (their status's stack).
        keys |= self.cache.keys_in_stacks(stacks)
        return Lane(stacks=frozenset(stacks), keys=frozenset(keys))

    def track(self, proxies: Iterable[Proxy]) -> None:
        for proxy in proxies:
            self._tracked[proxy.key] = PackedProxy(proxy)
        self.cache.mark(set(), relisted=True)

    def backend_loaded(self) -> None:
        """The control loop read the backend's stacks (every `track` is in): deletions seen before are
        judged now, against what the backend holds."""
        self._backend_read = True
        if self._deferred:
            self.cache.mark(set(self._deferred))
            self._deferred.clear()

    def release(self, key: str) -> None:
        """Its resources are gone or forgotten: forget it and remove our finalizer (the leader's job)."""
        self._unemit(key)
        self._leaving.discard(key)
        self._tracked.pop(key, None)
        self._holds.pop(key, None)
        self.finalizers.remove(key)

    def proxies(self) -> list[Proxy]:
        return [packed.proxy for packed in self._emitted.values()]

    def object(self, key: str) -> ProxyObject | None:
        return self.cache.object(key)

    def objects(self) -> list[ProxyObject]:
        return self.cache.objects()

    def credentials_for(self, proxy: Proxy) -> dict[str, str] | None:
        ref = _secret_key(proxy)
        return None if ref is None else self.cache.secret(ref)

    def secret_value(self, name: str, key: str) -> str | None:
        """A key of the Secret `name` in the service's namespace (where the catalogue names Secrets)."""
        data = self.cache.secret(f"{self.settings.own_namespace()}/{name}") or {}
        return data.get(key)

    # --- judging one object -----------------------------------------------------------------------------

    def _judge(self, key: str, obj: ProxyObject | None, change: SourceChange) -> None:
        if obj is None:
            self._gone(key, change)
            return
        if obj.deleting:
            self._deleting(key, obj, change)
            return
        self._leaving.discard(key)  # a live object of that name: an earlier deletion of it is over
        if self.writes and not obj.finalized:
            self.finalizers.add(key, bare=obj.bare)
        try:
            proxy = Proxy.model_validate(obj.body)
        except ValidationError as exc:
            change.held[key] = Hold(Reason.INVALID_SPEC, _invalid(obj, exc))
            return
        requested = obj.annotations.get(RECONCILE_REQUESTED)
        if requested and self._requested.get(key) != requested:
            if key in self._requested or key in self._emitted:
                change.requested.add(key)
            self._requested[key] = requested
        if obj.annotations.get(PAUSED) == "true":
            if key in self._emitted or key in self._tracked:
                change.held[key] = Hold(
                    Reason.PAUSED,
                    f"paused by the annotation {PAUSED}: changes wait, its stack keeps the last applied "
                    "version; remove the annotation to resume",
                )
                return
            change.held[key] = Hold(Reason.PAUSED, f"paused by the annotation {PAUSED} before it was applied")
            return
        emitted = self._emitted.get(key)
        if emitted is None or emitted.proxy != proxy:
            change.upserts.append(self._emit(proxy))  # the same packed copy: the planner keeps it too
        self._tracked.pop(key, None)

    def _deleting(self, key: str, obj: ProxyObject, change: SourceChange) -> None:
        """A deletion timestamp: declared. What it removes is decided later, with the annotations of the
        live object (skip-cleanup), and a change to them while it is deleting is passed on again."""
        live = obj.annotations
        if key in self._leaving:
            passed = self._emitted.get(key)
            if passed is not None and _skip_cleanup(passed.proxy.metadata.annotations) != _skip_cleanup(live):
                leaving = passed.proxy
                leaving.metadata.annotations = live
                change.deletions.append(self._emit(leaving).proxy)
            return
        known = self._emitted.get(key) or self._tracked.get(key)
        if known is None:
            if not self._backend_read:
                # The backend's stacks are not read yet (a new term, a restart): this Proxy may run. Nothing
                # is decided until they are; backend_loaded() judges it again.
                self._deferred.add(key)
                return
            # Never applied by us: nothing to remove, only our finalizer (if it got one).
            if obj.finalized:
                self.finalizers.remove(key)
            return
        leaving = known.proxy
        leaving.metadata.deletion_timestamp = _timestamp(obj.body["metadata"].get("deletionTimestamp"))
        leaving.metadata.annotations = live  # the live object's, not the stack output copy's (none there)
        self._emit(leaving)
        self._leaving.add(key)
        change.deletions.append(leaving)

    def _gone(self, key: str, change: SourceChange) -> None:
        """A DELETED event: the object is gone (a deletion declared without our finalizer on it)."""
        if key in self._leaving:
            return
        known = self._emitted.get(key) or self._tracked.get(key)
        if known is None:
            if not self._backend_read:
                self._deferred.add(key)  # judged again once the backend is read: it may be applied there
            return
        leaving = known.proxy
        leaving.metadata.deletion_timestamp = datetime.now(UTC)
        self._emit(leaving)
        self._leaving.add(key)
        change.deletions.append(leaving)

    def _take_catalogue(self, change: SourceChange) -> None:
        self._catalogue_seen = True
        where = f"ConfigMap {self.settings.own_namespace()}/{self.settings.catalogue_configmap}"
        doc = self.cache.catalogue_doc
        if doc is None:
            message = (
                f"no provider catalogue: {where} does not exist (or lacks the key "
                f"{self.settings.catalogue_key}); nothing is reconciled until it does"
                if self._catalogue is None
                else f"{where} is gone: the last catalogue is kept and nothing is removed until it is back"
            )
            change.problems.append(_catalogue_problem(where, message))
            return
        text = (doc.get("data") or {}).get(self.settings.catalogue_key)
        try:
            if not isinstance(text, str):
                raise CatalogueFormatError(f"no key {self.settings.catalogue_key}: put the catalogue there")
            body = yaml.safe_load(text)
            catalogue = parse_catalogue(body if isinstance(body, dict) else {"providers": body})
        except (CatalogueFormatError, ValidationError, yaml.YAMLError) as exc:
            change.problems.append(
                _catalogue_problem(where, f"{exc}; the last good catalogue is kept until this is fixed")
            )
            return
        if catalogue != self._catalogue:
            self._catalogue = change.catalogue = catalogue

    def _emit(self, proxy: Proxy) -> PackedProxy:
        packed = self._emitted[proxy.key] = PackedProxy(proxy)
        ref = _secret_key(proxy)
        if ref is None:
            self._secret_of.pop(proxy.key, None)
        else:
            self._secret_of[proxy.key] = ref
        return packed

    def _unemit(self, key: str) -> None:
        self._emitted.pop(key, None)
        self._secret_of.pop(key, None)


# --- helpers ------------------------------------------------------------------------------------------


def _skip_cleanup(annotations: dict[str, str]) -> bool:
    return annotations.get(SKIP_CLEANUP, "").strip().lower() == "true"


def _secret_key(proxy: Proxy) -> str | None:
    ref = proxy.spec.auth.secret_ref
    return None if ref is None else f"{ref.namespace or proxy.metadata.namespace}/{ref.name}"


def _timestamp(value: str | None) -> datetime:
    if not value:
        return datetime.now(UTC)
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _invalid(obj: ProxyObject, exc: ValidationError) -> str:
    errors = "; ".join(
        f"{'.'.join(str(p) for p in error['loc']) or 'spec'}: {error['msg']}" for error in exc.errors()[:5]
    )
    return f"Proxy {obj.key} is not valid: {errors}; fix it with kubectl edit/apply"


def _not_found(key: str) -> Hold:
    return Hold(
        Reason.NOT_FOUND,
        f"{key} runs (its stack's state says so) but no Proxy object of that name is found, and it was not "
        "deleted (no deletion timestamp was seen): its resources stay. Apply the Proxy again to manage it, "
        "then delete it if you mean to remove it",
    )


def _catalogue_problem(where: str, message: str) -> Problem:
    return Problem(file=where, document=None, line=None, obj="catalogue", path="", message=message)
