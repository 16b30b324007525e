"""Proxy objects in a Kubernetes API server as the source of desired state.

Watch threads (`service.kube.watch`) keep a slim copy of every Proxy (the fields the service uses, raw
JSON), the catalogue ConfigMap and the credentials Secrets; `poll` turns what changed since the last poll into
a `SourceChange`, under the same contract as the directory source:

- A deletion is declared only by the object itself: a deletion timestamp (behind our finalizer
  `crawl.example.com/cleanup`), or a DELETED event. Absence from a list is never a deletion: an applied proxy
  that no list shows is held (`ProxyNotFound`) and keeps running.
- A Proxy the model refuses (the CRD let it through) is held with its reason; its last valid version stays.
- `crawl.example.com/paused: "true"` freezes a Proxy at the version last passed on (held, `Paused`);
  deleting a paused Proxy still proceeds. A new value of `crawl.example.com/reconcile-requested-at` asks
  for a run of its stack (`SourceChange.requested`).
- With `writes` on (the leader), the finalizer is added to each live Proxy, and removed by `release` once
  its resources are gone or forgotten. Followers only read.

Secrets are watched by label (`crawl.example.com/credentials: "true"`) in the watched namespaces and the
service's own, so the service needs no cluster-wide Secret access: a Secret a Proxy names without that label
is "not found", and the Proxy's message says to label it.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import queue
import sys
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import yaml
from kubernetes.client import ApiClient
from pydantic import ValidationError

from service.kube.client import ApiException, request_json
from service.kube.settings import KubeSettings
from service.kube.watch import Obj, Watcher
from service.sources.contract import Hold, SourceChange
from stacks.catalogue import CatalogueFormatError, parse_catalogue
from stacks.models import API_VERSION, KIND, PackedProxy, ProviderCatalogue, Proxy
from stacks.models.conditions import ConditionType, Reason
from stacks.problems import Problem

log = logging.getLogger(__name__)

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "proxies"
FINALIZER = "crawl.example.com/cleanup"
PAUSED = "crawl.example.com/paused"
RECONCILE_REQUESTED = "crawl.example.com/reconcile-requested-at"
CREDENTIALS_LABEL = "crawl.example.com/credentials"

__all__ = ["FINALIZER", "KubernetesSource", "ProxyObject", "proxy_object"]


class ProxyObject:
    """What the service keeps of one Proxy object: identity, the parts it reconciles, and its status.

    `body` (metadata: name, namespace, labels, annotations, uid, generation, deletionTimestamp; and spec) and
    `status` are kept as compact JSON text, a fifth of the size of the dicts (the service watches 10,000
    Proxies at once), and decoded on each read: every caller gets its own copy.
    """

    __slots__ = (
        "_body",
        "_status",
        "deleting",
        "finalized",
        "generation",
        "name",
        "namespace",
        "resource_version",
        "uid",
    )

    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        uid: str,
        generation: int,
        resource_version: str,
        deleting: bool,
        finalized: bool,  # carries our finalizer
        body: Obj,
        status: Obj,
    ) -> None:
        self.namespace, self.name, self.uid = namespace, name, uid
        self.generation, self.resource_version = generation, resource_version
        self.deleting, self.finalized = deleting, finalized
        self._body = _pack(body)
        self._status = _pack(status) if status else ""

    @property
    def key(self) -> str:
        return sys.intern(f"{self.namespace}/{self.name}")  # one string per Proxy, as Proxy.key

    @property
    def body(self) -> Obj:
        return dict(json.loads(self._body))

    @property
    def status(self) -> Obj:
        return dict(json.loads(self._status)) if self._status else {}

    @property
    def annotations(self) -> dict[str, str]:
        return dict(self.body["metadata"].get("annotations") or {})

    def reconciled_parts(self) -> tuple[str, bool, bool]:
        """What a change must touch to matter to the control loop (our own status writes do not)."""
        return (self._body, self.deleting, self.finalized)

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProxyObject):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # compared by value, like the dataclass it replaced

    def __repr__(self) -> str:
        return f"ProxyObject({self.key}, rv={self.resource_version}, deleting={self.deleting})"


def _pack(obj: Obj) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def slim_proxy(obj: Obj) -> Obj:
    """The fields the service uses; managedFields, unrelated annotations and the rest are dropped."""
    meta = obj.get("metadata") or {}
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith("crawl.example.com/")
    }
    kept = {
        k: meta[k]
        for k in (
            "name",
            "namespace",
            "uid",
            "generation",
            "resourceVersion",
            "deletionTimestamp",
            "finalizers",
        )
        if k in meta
    }
    kept["labels"] = meta.get("labels") or {}
    kept["annotations"] = annotations
    return {"metadata": kept, "spec": obj.get("spec") or {}, "status": _slim_status(obj.get("status") or {})}


def _slim_status(status: Obj) -> Obj:
    """What a follower serves from and a new leader continues from: where it serves, its stack and egress
    address, and the Healthy condition (the rest is the leader's own, in its board)."""
    kept: Obj = {k: status[k] for k in ("address", "stack", "egressIP") if k in status}
    healthy = [c for c in status.get("conditions") or [] if c.get("type") == ConditionType.HEALTHY]
    if healthy:
        kept["conditions"] = healthy
    return kept


def proxy_object(raw: Obj) -> ProxyObject:
    """What the watch keeps of a listed or watched Proxy, made as each page or event is read: a list of
    10,000 kept as dicts until the last page left the heap fragmented for good (in-process: +36 MiB against
    +13 MiB when each object is made compact at once)."""
    obj = slim_proxy(raw)
    meta = obj["metadata"]
    body_meta = {k: v for k, v in meta.items() if k not in ("resourceVersion", "finalizers")}
    return ProxyObject(
        namespace=meta.get("namespace") or "default",
        name=meta["name"],
        uid=meta.get("uid") or "",
        generation=int(meta.get("generation") or 0),
        resource_version=str(meta.get("resourceVersion") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        finalized=FINALIZER in (meta.get("finalizers") or []),
        body={"apiVersion": API_VERSION, "kind": KIND, "metadata": body_meta, "spec": obj["spec"]},
        status=obj.get("status") or {},
    )


class KubernetesSource:
    def __init__(self, api: ApiClient, settings: KubeSettings, *, writes: bool = False) -> None:
        self.api = api
        self.settings = settings
        self.writes = writes  # the leader adds and removes finalizers; followers only read
        self.problems: list[Problem] = []
        self._lock = threading.Lock()
        self._objects: dict[str, ProxyObject] = {}
        self._dirty: set[str] = set()
        self._relisted = False  # a Proxy list replaced the set: absent tracked proxies are judged again
        # The version last passed on (what the planner knows), packed: one per Proxy, 10,000 at once.
        self._emitted: dict[str, PackedProxy] = {}
        self._secret_of: dict[str, str] = {}  # key -> the Secret its emitted version names
        self._leaving: set[str] = set()  # deletions passed on, not released yet
        self._tracked: dict[str, PackedProxy] = {}  # applied in the backend
        self._holds: dict[str, Hold] = {}
        self._requested: dict[str, str] = {}  # key -> last reconcile-requested-at seen
        self._catalogue: ProviderCatalogue | None = None
        self._catalogue_doc: Obj | None = None
        self._catalogue_dirty = False
        self._catalogue_seen = False
        self._secrets: dict[str, dict[str, str]] = {}  # namespace/name -> decoded data
        self._secrets_dirty: set[str] = set()
        self._patches: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self._patcher: threading.Thread | None = None
        self.on_change: Callable[[], None] = lambda: None  # wakes the control loop (set by the runner)
        self.watchers = self._watchers()

    # --- lifecycle --------------------------------------------------------------------------------------

    def start(self) -> None:
        for watcher in self.watchers:
            watcher.start()
        self._patcher = threading.Thread(target=self._patch_loop, name="proxy finalizers", daemon=True)
        self._patcher.start()

    def stop(self) -> None:
        for watcher in self.watchers:
            watcher.stop()
        self._patches.put(None)
        if self._patcher is not None:
            self._patcher.join(5)

    def synced(self) -> bool:
        return all(w.synced.is_set() for w in self.watchers)

    def desired_state_synced(self) -> bool:
        """Proxies and the catalogue were listed. Secrets are not waited for: a Secret watch that fails
        (RBAC) leaves the proxies that need one held (credentials missing), not the whole fleet."""
        return all(w.synced.is_set() for w in self.watchers if not w.name.startswith("secrets"))

    def wait_synced(self, timeout: float) -> bool:
        """Wait for the first list of Proxies and the catalogue (see desired_state_synced)."""
        return all(w.synced.wait(timeout) for w in self.watchers if not w.name.startswith("secrets"))

    def watch_errors(self) -> list[str]:
        return [f"{w.name}: {w.last_error}" for w in self.watchers if w.last_error]

    def replay(self) -> None:
        """Forget what was passed on: the next poll passes on everything again (the catalogue, every
        Proxy, every deletion in progress) for a new control loop that knows nothing yet (a new term)."""
        with self._lock:
            self._dirty |= set(self._objects)
            self._catalogue_dirty = True
            self._relisted = True
        self._catalogue = None
        self._emitted.clear()
        self._secret_of.clear()
        self._leaving.clear()
        self._tracked.clear()
        self._holds.clear()

    def set_writes(self, writes: bool) -> None:
        """Leading or not: a new leader adds the finalizers its predecessor may not have added yet."""
        with self._lock:
            self.writes = writes
            if writes:
                self._dirty |= set(self._objects)

    # --- the Source contract ----------------------------------------------------------------------------

    @property
    def catalogue(self) -> ProviderCatalogue | None:
        return self._catalogue

    def poll(self) -> SourceChange:
        change = SourceChange()
        if not self.desired_state_synced():
            change.complete = False
            return change
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            relisted, self._relisted = self._relisted, False
            catalogue_dirty, self._catalogue_dirty = self._catalogue_dirty, False
            secrets_dirty, self._secrets_dirty = self._secrets_dirty, set()
            objects = dict(self._objects)
        if catalogue_dirty or not self._catalogue_seen:
            self._take_catalogue(change)
        for key in sorted(dirty):
            self._judge(key, objects.get(key), change)
        if relisted or dirty:
            for key in sorted(set(self._tracked) - set(objects) - set(self._emitted)):
                change.held[key] = _not_found(key)
        if secrets_dirty:
            change.requested |= {key for key, ref in self._secret_of.items() if ref in secrets_dirty}
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
        return change

    def track(self, proxies: Iterable[Proxy]) -> None:
        with self._lock:
            for proxy in proxies:
                self._tracked[proxy.key] = PackedProxy(proxy)
            self._relisted = True

    def release(self, key: str) -> None:
        """Its resources are gone or forgotten: forget it and remove our finalizer (the leader's job)."""
        self._unemit(key)
        self._leaving.discard(key)
        self._tracked.pop(key, None)
        self._holds.pop(key, None)
        self._patches.put(("remove", key))

    def proxies(self) -> list[Proxy]:
        return [packed.proxy for packed in self._emitted.values()]

    def object(self, key: str) -> ProxyObject | None:
        with self._lock:
            return self._objects.get(key)

    def objects(self) -> list[ProxyObject]:
        with self._lock:
            return list(self._objects.values())

    def credentials_for(self, proxy: Proxy) -> dict[str, str] | None:
        ref = _secret_key(proxy)
        return None if ref is None else self._secrets.get(ref)

    def secret_value(self, name: str, key: str) -> str | None:
        """A key of the Secret `name` in the service's namespace (where the catalogue names Secrets)."""
        data = self._secrets.get(f"{self.settings.own_namespace()}/{name}") or {}
        return data.get(key)

    # --- judging one object -----------------------------------------------------------------------------

    def _judge(self, key: str, obj: ProxyObject | None, change: SourceChange) -> None:
        if obj is None:
            self._gone(key, change)
            return
        if obj.deleting:
            self._deleting(key, obj, change)
            return
        if self.writes and not obj.finalized:
            self._patches.put(("add", key))
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
        if key in self._leaving:
            return
        known = self._emitted.get(key) or self._tracked.get(key)
        if known is None:
            # Never applied by us: nothing to remove, only our finalizer (if it got one).
            if obj.finalized:
                self._patches.put(("remove", key))
            return
        leaving = known.proxy
        leaving.metadata.deletion_timestamp = _timestamp(obj.body["metadata"].get("deletionTimestamp"))
        self._emit(leaving)
        self._leaving.add(key)
        change.deletions.append(leaving)

    def _gone(self, key: str, change: SourceChange) -> None:
        """A DELETED event: the object is gone (a deletion declared without our finalizer on it)."""
        if key in self._leaving:
            return
        known = self._emitted.get(key) or self._tracked.get(key)
        if known is None:
            return
        leaving = known.proxy
        leaving.metadata.deletion_timestamp = datetime.now(UTC)
        self._emit(leaving)
        self._leaving.add(key)
        change.deletions.append(leaving)

    def _take_catalogue(self, change: SourceChange) -> None:
        self._catalogue_seen = True
        where = f"ConfigMap {self.settings.own_namespace()}/{self.settings.catalogue_configmap}"
        doc = self._catalogue_doc
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

    # --- watch callbacks (watch threads) ----------------------------------------------------------------

    def _watchers(self) -> list[Watcher]:
        base = f"/apis/{GROUP}/{VERSION}"
        own = self.settings.own_namespace()
        namespaces = self.settings.namespaces
        proxy_paths = [f"{base}/namespaces/{ns}/{PLURAL}" for ns in namespaces] or [f"{base}/{PLURAL}"]
        secret_paths = (
            [f"/api/v1/namespaces/{ns}/secrets" for ns in dict.fromkeys([*namespaces, own])]
            if namespaces
            else ["/api/v1/secrets"]
        )
        watchers = [
            Watcher(
                self.api,
                path,
                on_list=self._proxy_lister(path),
                on_event=self._proxy_event,
                slim=proxy_object,  # kept compact from the page on: see proxy_object
                name=f"proxies {_namespace_of(path) or '*'}",
            )
            for path in proxy_paths
        ]
        watchers.append(
            Watcher(
                self.api,
                f"/api/v1/namespaces/{own}/configmaps",
                on_list=self._catalogue_list,
                on_event=self._catalogue_event,
                field_selector=f"metadata.name={self.settings.catalogue_configmap}",
                name="catalogue",
            )
        )
        watchers += [
            Watcher(
                self.api,
                path,
                on_list=self._secret_lister(path),
                on_event=self._secret_event,
                slim=_slim_secret,
                label_selector=f"{CREDENTIALS_LABEL}=true",
                name=f"secrets {path}",
            )
            for path in secret_paths
        ]
        return watchers

    def _proxy_lister(self, path: str) -> Callable[[list[ProxyObject]], None]:
        namespace = _namespace_of(path)

        def on_list(items: list[ProxyObject]) -> None:
            fresh = {obj.key: obj for obj in items}
            with self._lock:
                for key in list(self._objects):
                    if (namespace is None or key.startswith(f"{namespace}/")) and key not in fresh:
                        # Gone from a list: never a deletion. Forget the object; a tracked or passed-on
                        # proxy stays known (and is judged "not found", not deleted).
                        self._objects.pop(key)
                for key, obj in fresh.items():
                    if self._objects.get(key) != obj:
                        self._objects[key] = obj
                        self._dirty.add(key)
                self._relisted = True
            self.on_change()

        return on_list

    def _proxy_event(self, kind: str, obj: ProxyObject) -> None:
        dirtied = True
        with self._lock:
            if kind == "DELETED":
                self._objects.pop(obj.key, None)
                self._dirty.add(obj.key)
            elif self._objects.get(obj.key) != obj:
                previous = self._objects.get(obj.key)
                self._objects[obj.key] = obj
                dirtied = previous is None or previous.reconciled_parts() != obj.reconciled_parts()
                if dirtied:
                    self._dirty.add(obj.key)
        if dirtied:  # not our own status writes: they change nothing to reconcile
            self.on_change()

    def _catalogue_list(self, items: list[Obj]) -> None:
        with self._lock:
            self._catalogue_doc = items[0] if items else None
            self._catalogue_dirty = True
        self.on_change()

    def _catalogue_event(self, kind: str, obj: Obj) -> None:
        with self._lock:
            self._catalogue_doc = None if kind == "DELETED" else obj
            self._catalogue_dirty = True
        self.on_change()

    def _secret_lister(self, path: str) -> Callable[[list[Obj]], None]:
        namespace = _namespace_of(path)

        def on_list(items: list[Obj]) -> None:
            fresh = {_ref(obj): _decode(obj) for obj in items}
            with self._lock:
                for ref in list(self._secrets):
                    if (namespace is None or ref.startswith(f"{namespace}/")) and ref not in fresh:
                        self._secrets.pop(ref)
                        self._secrets_dirty.add(ref)
                for ref, data in fresh.items():
                    if self._secrets.get(ref) != data:
                        self._secrets[ref] = data
                        self._secrets_dirty.add(ref)
            self.on_change()

        return on_list

    def _secret_event(self, kind: str, obj: Obj) -> None:
        ref = _ref(obj)
        with self._lock:
            if kind == "DELETED":
                self._secrets.pop(ref, None)
            else:
                self._secrets[ref] = _decode(obj)
            self._secrets_dirty.add(ref)
        self.on_change()

    # --- finalizers (the leader only) -------------------------------------------------------------------

    def _patch_loop(self) -> None:
        while True:
            item = self._patches.get()
            if item is None:
                return
            action, key = item
            if not self.writes:
                continue
            try:
                self._patch_finalizer(action, key)
            except ApiException as exc:
                if exc.status == 404:
                    continue
                log.warning(
                    "cannot %s the finalizer of %s: %s %s (tried again)", action, key, exc.status, exc.reason
                )
                self._retry_later(action, key)
            except Exception as exc:  # a network fault: the next event or poll tries again
                log.warning("cannot %s the finalizer of %s: %s (tried again)", action, key, exc)
                self._retry_later(action, key)

    def _retry_later(self, action: str, key: str) -> None:
        timer = threading.Timer(2.0, self._patches.put, args=[(action, key)])
        timer.daemon = True
        timer.start()

    def _patch_finalizer(self, action: str, key: str) -> None:
        """A JSON patch guarded by the resourceVersion (a 409/422 re-reads and tries again)."""
        namespace, name = key.split("/", 1)
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"
        for _ in range(5):
            current = request_json(self.api, "GET", path)
            meta = current.get("metadata") or {}
            finalizers = list(meta.get("finalizers") or [])
            if action == "add":
                if FINALIZER in finalizers or meta.get("deletionTimestamp"):
                    return
                ops: list[Obj] = (
                    [{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}]
                    if finalizers
                    else [{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}]
                )
            else:
                if FINALIZER not in finalizers:
                    return
                ops = [{"op": "remove", "path": f"/metadata/finalizers/{finalizers.index(FINALIZER)}"}]
            guard = {"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")}
            try:
                request_json(
                    self.api, "PATCH", path, body=[guard, *ops], content_type="application/json-patch+json"
                )
            except ApiException as exc:
                if exc.status in (409, 422):
                    continue  # changed under us: read again
                raise
            log.info("%s finalizer %s: %s", "added" if action == "add" else "removed", FINALIZER, key)
            return


# --- helpers ------------------------------------------------------------------------------------------


def _namespace_of(path: str) -> str | None:
    return path.split("/namespaces/")[1].split("/")[0] if "/namespaces/" in path else None


def _slim_secret(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    return {
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
        "data": obj.get("data") or {},
    }


def _ref(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _decode(obj: Obj) -> dict[str, str]:
    data: dict[str, str] = {}
    for key, value in (obj.get("data") or {}).items():
        try:
            data[key] = base64.b64decode(value, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError, TypeError):
            log.warning("Secret %s: key %s is not base64 UTF-8 text; left out", _ref(obj), key)
    return data


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
