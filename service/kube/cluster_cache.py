"""The watched copy of the cluster: Proxies, the catalogue ConfigMap and the credentials Secrets.

Watch threads (`service.kube.watch`) keep a slim copy of every Proxy (`ProxyObject`), the catalogue
ConfigMap and the labelled Secrets, and mark what changed; the source (`service.sources.kubernetes`) takes
the marks at each poll (`take`) and judges what changed. Nothing here decides anything: a Proxy gone from a
list is forgotten here and judged "not found" (never deleted) by the source. Once asked which Proxies a stack
holds (`keys_in_stacks`, a leader's lane), the copy keeps an index of them by their status's stack.

Secrets are watched by label (`crawl.example.com/credentials: "true"`) in the watched namespaces and the
service's own, so the service needs no cluster-wide Secret access.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from kubernetes.client import ApiClient

from service.kube.proxy_object import ProxyObject, proxy_object
from service.kube.settings import KubeSettings
from service.kube.watch import Obj, Watcher
from stacks.models import API_VERSION

log = logging.getLogger(__name__)

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "proxies"
CREDENTIALS_LABEL = "crawl.example.com/credentials"


@dataclass
class Marks:
    """What changed since the last `take`, and the objects as they are now."""

    dirty: set[str] = field(default_factory=set)
    relisted: bool = False  # a Proxy list replaced the set: absent tracked proxies are judged again
    catalogue_dirty: bool = False
    secrets_dirty: set[str] = field(default_factory=set)
    objects: dict[str, ProxyObject] = field(default_factory=dict)


class ClusterCache:
    def __init__(self, api: ApiClient, settings: KubeSettings) -> None:
        self.api = api
        self.settings = settings
        self._lock = threading.Lock()
        self._objects: dict[str, ProxyObject] = {}
        self._dirty: set[str] = set()
        # stack -> the keys whose status names it: made at the first `keys_in_stacks` (a follower, asking
        # none, keeps none: a set of 10,000 keys is half a MiB), then kept by `_put` and `_drop`.
        self._by_stack: dict[str, set[str]] | None = None
        self._fresh: set[str] = set()  # dirtied by a watch event (a change made now), not by a list or mark
        self.fresh_wanted = False  # kept for the leader (KubernetesSource.urgent); a follower keeps none
        self.removals = 0  # Proxies that left the copy so far: what keeps their followers' state goes too
        self._relisted = False
        self._catalogue_doc: Obj | None = None
        self._catalogue_dirty = False
        self._secrets: dict[str, dict[str, str]] = {}  # namespace/name -> decoded data
        self._secrets_dirty: set[str] = set()
        self.on_change: Callable[[], None] = lambda: None  # wakes the control loop (set by the runner)
        # Each listed or watched Proxy as read, before it is slimmed (watch threads): the status a
        # follower shows (service/status_view.py) is kept whole there, not in the slim copy.
        self.on_read: Callable[[Obj], None] = lambda raw: None
        # Each Proxy whose kept copy changed in any way (its status too), or that left it: called after the
        # copy changed (watch threads). A follower's inventory follows these (service/kube/follower.py).
        self.on_object: Callable[[str], None] = lambda key: None
        self.watchers = self._make_watchers()

    def _slim(self, raw: Obj) -> ProxyObject:
        self.on_read(raw)
        return proxy_object(raw)

    # --- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        for watcher in self.watchers:
            watcher.start()

    def stop(self) -> None:
        for watcher in self.watchers:
            watcher.stop()

    def synced(self) -> bool:
        return all(w.synced.is_set() for w in self.watchers)

    def desired_state_synced(self) -> bool:
        """Proxies and the catalogue were listed. Secrets are not waited for: a Secret watch that fails
        (RBAC) leaves the proxies that need one held (credentials missing), not the whole fleet."""
        return all(w.synced.is_set() for w in self.watchers if not w.name.startswith("secrets"))

    def wait_synced(self, timeout: float) -> bool:
        return all(w.synced.wait(timeout) for w in self.watchers if not w.name.startswith("secrets"))

    def watch_errors(self) -> list[str]:
        return [f"{w.name}: {w.last_error}" for w in self.watchers if w.last_error]

    # --- what the source reads ------------------------------------------------------------------------

    def take(self) -> Marks:
        """The marks since the last take (cleared), with a copy of the objects."""
        with self._lock:
            marks = Marks(
                dirty=self._dirty,
                relisted=self._relisted,
                catalogue_dirty=self._catalogue_dirty,
                secrets_dirty=self._secrets_dirty,
                objects=dict(self._objects),
            )
            self._dirty, self._relisted, self._catalogue_dirty = set(), False, False
            self._secrets_dirty = set()
        return marks

    def take_fresh(self) -> set[str]:
        """The keys that watch events changed since the last call (cleared)."""
        with self._lock:
            fresh, self._fresh = self._fresh, set()
        return fresh

    def mark(self, keys: set[str] | None = None, *, relisted: bool = False, catalogue: bool = False) -> None:
        """Judge these keys (None: every object) again at the next poll."""
        with self._lock:
            self._dirty |= set(self._objects) if keys is None else keys
            self._relisted = self._relisted or relisted
            self._catalogue_dirty = self._catalogue_dirty or catalogue

    @property
    def catalogue_doc(self) -> Obj | None:
        return self._catalogue_doc

    def object(self, key: str) -> ProxyObject | None:
        with self._lock:
            return self._objects.get(key)

    def objects(self) -> list[ProxyObject]:
        with self._lock:
            return list(self._objects.values())

    def keys_in_stacks(self, stacks: Collection[str]) -> set[str]:
        """The keys of the objects whose status's stack is one of `stacks`, without decoding any status."""
        with self._lock:
            if self._by_stack is None:
                self._by_stack = {}
                for obj in self._objects.values():
                    self._index(obj)
            return {key for stack in stacks for key in self._by_stack.get(stack, ())}

    def secret(self, ref: str) -> dict[str, str] | None:
        return self._secrets.get(ref)

    def _make_watchers(self) -> list[Watcher]:
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
                slim=self._slim,  # kept compact from the page on: see proxy_object
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
            touched: list[str] = []
            with self._lock:
                for key in list(self._objects):
                    if (namespace is None or key.startswith(f"{namespace}/")) and key not in fresh:
                        # Gone from a list: never a deletion. Forget the object; a tracked or passed-on
                        # proxy stays known (and is judged "not found", not deleted).
                        self._drop(key)
                        self.removals += 1
                        touched.append(key)
                for key, obj in fresh.items():
                    if self._objects.get(key) != obj:
                        self._put(obj)
                        self._dirty.add(key)
                        touched.append(key)
                self._relisted = True
            for key in touched:
                self.on_object(key)
            self.on_change()

        return on_list

    def _proxy_event(self, kind: str, obj: ProxyObject) -> None:
        dirtied = True
        with self._lock:
            if kind == "DELETED":
                self._drop(obj.key)
                self.removals += 1
                self._dirty.add(obj.key)
            elif self._objects.get(obj.key) != obj:
                previous = self._put(obj)
                dirtied = previous is None or not previous.same_reconciled_parts(obj)
                if dirtied:
                    self._dirty.add(obj.key)
                if self.fresh_wanted and (previous is None or not previous.same_body(obj)):
                    self._fresh.add(obj.key)  # someone's change (not our finalizer)
        self.on_object(obj.key)
        if dirtied:  # not our own status writes: they change nothing to reconcile
            self.on_change()

    def _put(self, obj: ProxyObject) -> ProxyObject | None:
        """Keep `obj` in place of the object of its key (under the lock); returns the one it replaced. The
        same Proxy's uid stays the first copy's string: the status and credentials writers keep it as a key,
        and each status write read back would otherwise leave them a copy of their own (85 bytes a proxy)."""
        previous = self._objects.get(obj.key)
        if previous is not None and previous.uid == obj.uid:
            obj.uid = previous.uid
        self._objects[obj.key] = obj
        if previous is not None and previous.stack != obj.stack:
            self._unindex(previous)
        self._index(obj)
        return previous

    def _drop(self, key: str) -> None:
        """Forget the object of `key`, if kept (under the lock)."""
        obj = self._objects.pop(key, None)
        if obj is not None:
            self._unindex(obj)

    def _index(self, obj: ProxyObject) -> None:
        if self._by_stack is not None and obj.stack is not None:
            self._by_stack.setdefault(obj.stack, set()).add(obj.key)

    def _unindex(self, obj: ProxyObject) -> None:
        if self._by_stack is None or obj.stack is None:
            return
        keys = self._by_stack.get(obj.stack)
        if keys is not None:
            keys.discard(obj.key)
            if not keys:
                del self._by_stack[obj.stack]

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
