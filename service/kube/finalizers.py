"""Our finalizer on Proxy objects: added to each live Proxy, removed once its resources are gone.

One thread writes them, in order, and only while this replica leads (`writes`): a follower's queue is
drained without writing, and a term that ends stops writing at once. Removal is the only step that lets a
Proxy object go, so the source asks for it only for a Proxy whose resources are gone or forgotten, or one
it never applied, and only once the backend was read (see KubernetesSource).

Each write is a JSON patch guarded by the resourceVersion it read (a 409/422 reads again); a failure is
tried again after 2 s; a 404 means the object is gone already. An add to a Proxy that the watch saw with
no finalizer at all (`bare`: a new leader taking in 10,000 fresh Proxies) is first sent without that read,
guarded by a test that it still has none (a resourceVersion seen by the watch is out of date as soon as its
status is written, which the status writer does at the same time); a Proxy given a finalizer meanwhile
fails the test and is read.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from kubernetes.client import ApiClient

from service.kube.client import ApiException, request_json
from service.kube.proxy_object import FINALIZER
from service.kube.watch import Obj
from stacks.models import API_VERSION

log = logging.getLogger(__name__)

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "proxies"
RETRY_SECONDS = 2.0


class FinalizerWriter:
    def __init__(self, api: ApiClient, *, writes: Callable[[], bool]) -> None:
        self.api = api
        self._writes = writes
        self._queue: queue.Queue[tuple[str, str, bool] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="proxy finalizers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(5)

    def add(self, key: str, *, bare: bool = False) -> None:
        """Add ours; `bare`: the watch saw the object with no finalizer at all."""
        self._queue.put(("add", key, bare))

    def remove(self, key: str) -> None:
        self._queue.put(("remove", key, False))

    def idle(self) -> bool:
        return self._queue.empty()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            action, key, bare = item
            if not self._writes():
                continue
            try:
                if not (bare and self._add_bare(key)):
                    self._patch(action, key)
            except ApiException as exc:
                if exc.status == 404:
                    continue
                log.warning(
                    "cannot %s the finalizer of %s: %s %s (tried again)", action, key, exc.status, exc.reason
                )
                self._retry_later(action, key)
            except Exception as exc:  # a network fault: tried again
                log.warning("cannot %s the finalizer of %s: %s (tried again)", action, key, exc)
                self._retry_later(action, key)

    def _retry_later(self, action: str, key: str) -> None:
        timer = threading.Timer(RETRY_SECONDS, self._queue.put, args=[(action, key, False)])
        timer.daemon = True
        timer.start()

    def _add_bare(self, key: str) -> bool:
        """Add ours to an object that has no finalizer, unread; False when it has one by now (or is being
        deleted: no finalizer may be added then), to be read and judged."""
        ops = [
            {"op": "test", "path": "/metadata/finalizers", "value": None},
            *_ops("add", [], deleting=False),
        ]
        try:
            request_json(self.api, "PATCH", _path(key), body=ops, content_type="application/json-patch+json")
        except ApiException as exc:
            if exc.status in (409, 422):
                return False
            raise
        log.info("added finalizer %s: %s", FINALIZER, key)
        return True

    def _patch(self, action: str, key: str) -> None:
        path = _path(key)
        for _ in range(5):
            current = request_json(self.api, "GET", path)
            meta = current.get("metadata") or {}
            ops = _ops(
                action, list(meta.get("finalizers") or []), deleting=bool(meta.get("deletionTimestamp"))
            )
            if not ops:
                return
            guard = {"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")}
            if not self._writes():
                return  # the term ended while we read
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


def _path(key: str) -> str:
    namespace, name = key.split("/", 1)
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"


def _ops(action: str, finalizers: list[str], *, deleting: bool) -> list[Obj]:
    if action == "add":
        if FINALIZER in finalizers or deleting:
            return []
        if finalizers:
            return [{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}]
        return [{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}]
    if FINALIZER not in finalizers:
        return []
    return [{"op": "remove", "path": f"/metadata/finalizers/{finalizers.index(FINALIZER)}"}]
