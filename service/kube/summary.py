"""What only the leader knows, published for the followers: the held deletion, the stacks' queue and
outputs, the pools' status (the fleet page shows them on every replica).

The leader writes one ConfigMap, `<lease_name>-summary` in the service's namespace, key `summary.json`:
when its held deletion changes (at once), when the rest changes (at most every `spacing` seconds), and at
least every `refresh` seconds (so a follower can tell a stale summary by its time). A write happens only
while this replica leads, checked just before the call; a replica that lost the Lease between that check
and the write can leave one stale summary, which the new leader replaces on its first poll (the summary
drives nothing: it is read by people, never by the control loop).

A follower reads it on a page view, at most once every `ttl` seconds (a GET; no watch). A summary larger
than a ConfigMap holds is cut: a held deletion lists at most `MAX_KEYS` of its keys (with their count).

Blocking calls (from worker threads).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes.client import ApiClient

from service.kube.client import ApiException, request_json
from service.kube.lease import API_ERRORS
from service.kube.settings import KubeSettings

__all__ = ["MAX_KEYS", "PublishedSummary", "SummaryPublisher", "SummaryReader", "SummaryTask", "summary_name"]

log = logging.getLogger(__name__)
KEY = "summary.json"
MAX_KEYS = 500  # keys of a held deletion listed in the summary (10,000 keys would near the 1 MiB limit)


def summary_name(settings: KubeSettings) -> str:
    return f"{settings.lease_name}-summary"[:253]


@dataclass(frozen=True)
class PublishedSummary:
    """The leader's summary as a follower reads it (the JSON's fields, already parsed)."""

    leader: str
    term: int
    published_at: float  # wall time
    held_deletion: dict[str, Any] | None
    stacks: list[dict[str, Any]]
    pools: dict[str, dict[str, Any]]
    pool_decisions: list[dict[str, Any]]
    forgotten: list[dict[str, Any]]

    @classmethod
    def parse(cls, text: str) -> PublishedSummary:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("the summary is not a JSON object")
        held = doc.get("heldDeletion")
        return cls(
            leader=str(doc.get("leader") or ""),
            term=int(doc.get("term") or 0),
            published_at=_wall(str(doc.get("publishedAt") or "")),
            held_deletion=held if isinstance(held, dict) else None,
            stacks=[s for s in doc.get("stacks") or [] if isinstance(s, dict)],
            pools={str(k): v for k, v in (doc.get("pools") or {}).items() if isinstance(v, dict)},
            pool_decisions=[d for d in doc.get("poolDecisions") or [] if isinstance(d, dict)],
            forgotten=[f for f in doc.get("forgotten") or [] if isinstance(f, dict)],
        )


def _wall(text: str) -> float:
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return 0.0


@dataclass
class SummaryPublisher:
    """The leader's side. `publish` takes the summary's content (held deletion, stacks, pools as JSON
    values); the leader's name, term and time are added here."""

    api: ApiClient
    settings: KubeSettings
    leading: Callable[[], bool]
    refresh: float = 30.0
    spacing: float = 5.0  # at most one write this often, unless the held deletion changed
    clock: Callable[[], float] = time.monotonic
    _last: str | None = None  # the content last written (without its time)
    _last_held: str | None = None
    _last_at: float = float("-inf")
    _lock: threading.Lock = field(default_factory=threading.Lock)
    writes: int = 0

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.settings.namespace}/configmaps"

    def publish(self, content: dict[str, Any], *, term: int) -> bool:
        """Write the summary if it changed or is due; True if written. A failed write is logged and tried
        again on the next call (the summary is informative: nothing waits for it)."""
        held = content.get("heldDeletion")
        if isinstance(held, dict) and len(held.get("keys") or []) > MAX_KEYS:
            content = {**content, "heldDeletion": {**held, "keys": list(held["keys"])[:MAX_KEYS]}}
        body = json.dumps({"leader": self.settings.identity, "term": term, **content}, sort_keys=True)
        held = json.dumps(content.get("heldDeletion"), sort_keys=True)
        with self._lock:
            now = self.clock()
            since = now - self._last_at
            due = since >= self.refresh or (body != self._last and since >= self.spacing)
            if not due and held == self._last_held:
                return False
            if not self.leading():
                return False
            doc = {"publishedAt": datetime.now(UTC).isoformat(), **json.loads(body)}
            try:
                self._write(json.dumps(doc, sort_keys=True, separators=(",", ":")))
            except API_ERRORS as exc:
                log.warning("cannot publish the leader's summary (tried again): %s", exc)
                return False
            self._last, self._last_held, self._last_at = body, held, now
            self.writes += 1
            return True

    def _write(self, text: str) -> None:
        name = summary_name(self.settings)
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "proxy-operator"}},
            "data": {KEY: text},
        }
        try:
            request_json(self.api, "PUT", f"{self.path}/{name}", body=body)
        except ApiException as exc:
            if exc.status != 404:
                raise
            request_json(self.api, "POST", self.path, body=body)


class SummaryTask:
    """The leader's loop calls `tick` every poll: one publish at a time, in a worker thread, so an
    unreachable apiserver never holds up the loop. `content` (set by serve) makes the summary."""

    def __init__(self, publisher: SummaryPublisher) -> None:
        self.publisher = publisher
        self.content: Callable[[], dict[str, Any]] | None = None
        self._running: asyncio.Task[bool] | None = None

    def tick(self, *, term: int) -> None:
        if self.content is None or (self._running is not None and not self._running.done()):
            return
        try:
            content = self.content()
        except Exception:  # the summary is informative; its failure must not stop the leader's loop
            log.exception("cannot build the leader's summary")
            return
        publish = functools.partial(self.publisher.publish, content, term=term)
        self._running = asyncio.create_task(asyncio.to_thread(publish), name="summary")

    async def close(self) -> None:
        if self._running is not None:
            await asyncio.gather(self._running, return_exceptions=True)


@dataclass
class SummaryReader:
    """A follower's side: the last summary read, fetched again when older than `ttl` seconds."""

    api: ApiClient
    settings: KubeSettings
    ttl: float = 2.0
    clock: Callable[[], float] = time.monotonic
    error: str | None = None  # why the last read failed, for the page
    _cached: PublishedSummary | None = None
    _read_at: float = float("-inf")
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def read(self) -> PublishedSummary | None:
        with self._lock:
            now = self.clock()
            if now - self._read_at < self.ttl:
                return self._cached
            self._read_at = now
            path = f"/api/v1/namespaces/{self.settings.namespace}/configmaps/{summary_name(self.settings)}"
            try:
                found = request_json(self.api, "GET", path)
                self._cached = PublishedSummary.parse(str((found.get("data") or {}).get(KEY) or "{}"))
                self.error = None
            except ApiException as exc:
                self._cached = None
                self.error = (
                    "the leader has not published a summary yet"
                    if exc.status == 404
                    else f"reading the leader's summary failed: {exc.status} {exc.reason}"
                )
            except (*API_ERRORS, ValueError) as exc:
                self._cached = None
                self.error = f"reading the leader's summary failed: {exc}"
            return self._cached
