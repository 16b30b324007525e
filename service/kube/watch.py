"""List + watch one kind of object, in a thread, keeping only what the caller needs.

One `Watcher` per resource path (all namespaces, or one namespace, with label/field selectors). It
lists (in pages), hands the whole set to `on_list`, then watches from the list's resourceVersion and
hands each event to `on_event`. Bookmarks keep the resourceVersion fresh; a watch that ends (the server's
timeout, a dropped stream, an apiserver restart) resumes from the last resourceVersion; 410 Gone (that
version was compacted away) lists again. Errors are retried with capped, jittered backoff, and
`last_error` says so. Objects go through `slim` before anyone keeps them: raw JSON, never the client's
model objects.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import ApiClient
from urllib3.exceptions import HTTPError as Urllib3Error

from service.kube.client import ApiException, call, request_json

log = logging.getLogger(__name__)

Obj = dict[str, Any]
GONE = 410
PAGE = 500


@dataclass
class Watcher:
    api: ApiClient
    path: str  # e.g. /apis/crawl.example.com/v1alpha1/proxies or /api/v1/namespaces/x/secrets
    on_list: Callable[[list[Any]], None]  # the whole set (each after slim): replaces what was known
    on_event: Callable[[str, Any], None]  # ADDED / MODIFIED / DELETED, the object after slim
    # What is kept of each object, made as each page or event is read (a dict of the fields needed, or a
    # compact object of the caller's): the full objects of a page are dropped before the next is read.
    slim: Callable[[Obj], Any] = lambda obj: obj
    label_selector: str | None = None
    field_selector: str | None = None
    timeout_seconds: int = 300  # the server ends each watch after this (jittered): a cheap liveness check
    backoff_cap: float = 30.0
    name: str = ""
    resource_version: str | None = None
    synced: threading.Event = field(default_factory=threading.Event)
    last_error: str | None = None
    lists: int = 0  # how many times the whole set was listed (first sync, 410s, errors before a sync)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _response: Any = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"watch {self.name or self.path}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        response = self._response
        if response is not None:  # unblock a read in progress
            with contextlib.suppress(AttributeError, OSError, Urllib3Error):
                response.response.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)

    # --- the loop -----------------------------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self._list()
                self._watch()
                failures = 0
            except ApiException as exc:
                if exc.status == GONE:
                    log.info("watch %s: resourceVersion too old, listing again", self.path)
                    self.resource_version = None
                    continue
                failures += 1
                self._failed(f"{exc.status} {exc.reason}: {_message(exc)}", failures)
            except (Urllib3Error, OSError, ValueError) as exc:
                if self._stop.is_set():
                    return
                failures += 1
                self._failed(f"{type(exc).__name__}: {exc}", failures)

    def _failed(self, message: str, failures: int) -> None:
        if self.last_error != message:
            log.warning("watch %s: %s (retrying)", self.path, message)
        self.last_error = message
        delay = random.uniform(0, min(self.backoff_cap, 0.5 * 2 ** min(failures, 10)))
        self._stop.wait(delay)

    def _list(self) -> None:
        items: list[Any] = []
        token: str | None = None
        while True:
            query = [*self._selectors(), ("limit", PAGE)]
            if token:
                query.append(("continue", token))
            page = request_json(self.api, "GET", self.path, query=query, timeout=(10, 60))
            items.extend(self.slim(obj) for obj in page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
        self.resource_version = (page.get("metadata") or {}).get("resourceVersion")
        self.lists += 1
        self.on_list(items)
        self.last_error = None
        self.synced.set()

    def _watch(self) -> None:
        timeout = int(self.timeout_seconds * random.uniform(1.0, 1.2))
        query = [
            *self._selectors(),
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", self.resource_version),
            ("timeoutSeconds", timeout),
        ]
        response = call(self.api, "GET", self.path, query=query, timeout=(10, timeout + 30))
        self._response = response
        ended = False  # the server ended the stream: the connection can serve another request
        try:
            if self._stop.is_set():  # stopped while the watch was being opened: stop() saw no response
                return
            buffer = b""
            for chunk in response.response.stream(64 * 1024, decode_content=True):
                if self._stop.is_set():
                    return
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._event(json.loads(line))
            ended = True
        finally:
            self._response = None
            if not ended:
                # Still streaming: back in the pool, the next request on this client would be written
                # behind the open watch and wait for its timeout. Close it; the pool opens a new one.
                response.response.close()
            response.response.release_conn()

    def _event(self, event: Obj) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            raise ApiException(status=int(obj.get("code") or 500), reason=str(obj.get("message") or obj))
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            self.resource_version = version
        if kind == "BOOKMARK":
            return
        self.on_event(str(kind), self.slim(obj))
        self.last_error = None

    def _selectors(self) -> list[tuple[str, Any]]:
        query: list[tuple[str, Any]] = []
        if self.label_selector:
            query.append(("labelSelector", self.label_selector))
        if self.field_selector:
            query.append(("fieldSelector", self.field_selector))
        return query


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except ValueError:
        return str(exc.reason)
