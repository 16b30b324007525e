"""The status a replica shows (the API's `/v1/status`, the fleet page): its own board while it leads, else
each Proxy's status as the leader wrote it to the cluster.

In a cluster only the leader's board changes (it reconciles and probes); a follower's stays empty, so before
this a follower answered `/v1/status` with nothing and its page showed no reasons. `ClusterStatus` keeps
every watched Proxy's status as read (the watch's copy is slimmed to what the control loop needs): JSON
deflated with a shared dictionary (stacks/compact.py; about 340 bytes a proxy in
tests/bench/bench_leader_state.py), packed on the watch thread with no model decode, and decoded only where
it is read (a page's rows, one `/v1/status` call). `ReplicaStatus` reads the board or that copy by the
replica's role, and tells its listeners about every key when the role changes (the page's index then reads
the other side).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import ValidationError

from service.status import Event, StatusBoard, held_conditions
from stacks.compact import STATUS_PACKER
from stacks.models import Condition, ProxyStatus


def pack_status_json(status: dict[str, Any]) -> bytes:
    """A status as plain JSON, packed (stacks/compact.py) with its keys sorted: the same content packs to
    the same bytes whoever made it (the status writer, the watch's read of the API server's copy)."""
    return STATUS_PACKER.pack(json.dumps(status, separators=(",", ":"), sort_keys=True).encode())


class ClusterStatus:
    """Each Proxy's status as written in the cluster (a `StatusReader`; only the watch writes it)."""

    def __init__(self) -> None:
        self._packed: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._listeners: list[Callable[[str], None]] = []
        # The leader's status writer holds what it last wrote, packed the same way: when the watch reads
        # that back, the writer's copy is kept (`StatusWriter.shared`), not a second one of the same bytes.
        self.share: Callable[[str, bytes], bytes] = lambda _key, packed: packed

    def observe(self, raw: dict[str, Any]) -> None:
        """A Proxy as listed or watched (a watch thread; a DELETED event's last copy too: `keep_only`
        drops it)."""
        meta = raw.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        status = raw.get("status") or {}
        packed = self.share(key, pack_status_json(status)) if status else None
        with self._lock:
            if self._packed.get(key) == packed:
                return
            if packed is None:
                self._packed.pop(key, None)
            else:
                self._packed[key] = packed
        self._tell(key)

    def keep_only(self, keys: Iterable[str]) -> None:
        """Drop the statuses of Proxies no longer watched (each poll: a set difference)."""
        present = set(keys)
        with self._lock:
            gone = [key for key in self._packed if key not in present]
            for key in gone:
                del self._packed[key]
        for key in gone:
            self._tell(key)

    def _tell(self, key: str) -> None:
        for listener in self._listeners:
            listener(key)

    def packed(self, key: str) -> bytes | None:
        """The status as the watch last read it, packed (`pack_status_json`); None when it has none."""
        with self._lock:
            return self._packed.get(key)

    def raw(self, key: str) -> dict[str, Any]:
        """The status as the watch last read it, as plain JSON ({} when it has none): what a new leader's
        status writer compares with instead of reading each Proxy again (service/kube/status_writer.py)."""
        with self._lock:
            packed = self._packed.get(key)
        return dict(json.loads(STATUS_PACKER.unpack(packed))) if packed is not None else {}

    # --- StatusReader ----------------------------------------------------------------------------------

    def subscribe(self, listener: Callable[[str], None]) -> None:
        self._listeners.append(listener)

    def published(self, key: str) -> ProxyStatus | None:
        with self._lock:
            packed = self._packed.get(key)
        if packed is None:
            return None
        with contextlib.suppress(ValidationError, ValueError):  # written by another version: unread
            return ProxyStatus.model_validate(json.loads(STATUS_PACKER.unpack(packed)))
        return None

    def get(self, key: str) -> ProxyStatus:
        return self.published(key) or ProxyStatus()

    def tracked(self) -> list[str]:
        with self._lock:
            return list(self._packed)

    def has(self, key: str) -> bool:
        with self._lock:
            return key in self._packed

    def all(self) -> dict[str, ProxyStatus]:
        return {key: status for key in self.tracked() if (status := self.published(key)) is not None}

    def held(self) -> dict[str, Condition]:
        return held_conditions(self.all())

    def events(self, key: str | None = None) -> list[Event]:
        return []  # a follower records none: the leader's are Kubernetes Events (`kubectl get events`)


class ReplicaStatus:
    """A `StatusReader` over the leader's own board or the cluster's copy, by `leading()`."""

    def __init__(self, *, own: StatusBoard, cluster: ClusterStatus, leading: Callable[[], bool]) -> None:
        self.own, self.cluster, self.leading = own, cluster, leading
        self._listeners: list[Callable[[str], None]] = []
        own.subscribe(lambda key: self._tell(key) if self.leading() else None)
        cluster.subscribe(lambda key: None if self.leading() else self._tell(key))

    @property
    def _side(self) -> StatusBoard | ClusterStatus:
        return self.own if self.leading() else self.cluster

    def switched(self) -> None:
        """The role changed: every key may read differently now."""
        for key in set(self.own.tracked()) | set(self.cluster.tracked()):
            self._tell(key)

    def _tell(self, key: str) -> None:
        for listener in self._listeners:
            listener(key)

    # --- StatusReader ----------------------------------------------------------------------------------

    def subscribe(self, listener: Callable[[str], None]) -> None:
        self._listeners.append(listener)

    def get(self, key: str) -> ProxyStatus:
        return self._side.get(key)

    def published(self, key: str) -> ProxyStatus | None:
        return self._side.published(key)

    def tracked(self) -> list[str]:
        return self._side.tracked()

    def has(self, key: str) -> bool:
        return self._side.has(key)

    def all(self) -> dict[str, ProxyStatus]:
        return self._side.all()

    def held(self) -> dict[str, Condition]:
        return self._side.held()

    def events(self, key: str | None = None) -> list[Event]:
        """The leader's own (a follower's board has none; nor does the cluster's copy)."""
        return self.own.events(key)
