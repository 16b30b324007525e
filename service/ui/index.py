"""The fleet page's index: per proxy the few fields that filter and sort read (names, pool, provider,
stack, phase, ready), kept beside the status board so that a view does not decode 10,000 statuses.

The board and the inventory tell the index what changed (a key, or "the endpoints"); the listener only
marks it, on the writer's thread. The next read refreshes what was marked: a status decode per changed key,
a walk over the inventory's endpoints after they changed. About 120 bytes a row (10,000 rows: 1.1 MiB,
tests/bench/bench_ui.py). Until the page is first read nothing is marked (the first read builds every row):
a replica whose page nobody opens keeps no set of 10,000 marked keys (0.5 MiB).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from service.inventory import Inventory
from service.status import StatusReader


@dataclass(frozen=True, slots=True)
class Row:
    key: str
    pool: str
    provider: str
    stack: str
    phase: str
    ready: bool
    reason: str  # the Ready condition's reason when not ready ("" when ready)


@dataclass
class FleetIndex:
    inventory: Inventory
    board: StatusReader | None
    _rows: dict[str, Row] = field(default_factory=dict)
    _dirty: set[str] = field(default_factory=set)
    _endpoints_changed: bool = True
    _built: bool = False  # read once: from then on changes are marked
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _refreshing: threading.Lock = field(default_factory=threading.Lock)  # one refresh at a time: no stale row

    def __post_init__(self) -> None:
        self.inventory.add_listener(self._mark_endpoints)
        if self.board is not None:
            self.board.subscribe(self._mark)

    def rows(self) -> list[Row]:
        """Thread-safe: the page calls it in a worker thread, so the first build (a decode per status, about
        a second for 10,000) does not stop the event loop."""
        with self._refreshing:
            self._refresh()
        with self._lock:
            return list(self._rows.values())

    def _mark(self, key: str) -> None:
        with self._lock:
            if self._built:
                self._dirty.add(key)

    def _mark_endpoints(self) -> None:
        with self._lock:
            self._endpoints_changed = True

    def _refresh(self) -> None:
        with self._lock:
            first, self._built = not self._built, True  # a change from now on is marked, and read next time
            dirty, self._dirty = self._dirty, set()
            endpoints, self._endpoints_changed = self._endpoints_changed, False
        if first and self.board is not None:
            dirty.update(self.board.tracked())  # every status as it is now
        if endpoints:
            dirty |= self._take_endpoints()
        for key in dirty:
            row = self._row(key)
            with self._lock:
                if row is None:
                    self._rows.pop(key, None)
                else:
                    self._rows[key] = row

    def _take_endpoints(self) -> set[str]:
        """Pool, provider and stack from the endpoints, without decoding a status; returns the keys that
        need one (new here, or gone from the inventory)."""
        endpoints = {ep.key: ep for ep in self.inventory.endpoints()}
        with self._lock:
            for key, ep in endpoints.items():
                row = self._rows.get(key)
                if row is not None:
                    self._rows[key] = replace(
                        row, pool=ep.pool or "", provider=ep.provider, stack=row.stack or ep.stack or ""
                    )
            return (set(endpoints) - set(self._rows)) | (set(self._rows) - set(endpoints))

    def _row(self, key: str) -> Row | None:
        endpoint = self.inventory.get(key)
        status = self.board.published(key) if self.board is not None else None
        if endpoint is None and status is None:
            return None
        phase, ready, reason, stack = "Unknown", False, "", ""
        if status is not None:
            phase, stack = status.phase or "Unknown", status.stack or ""
            cond = next((c for c in status.conditions if c.type == "Ready"), None)
            ready = cond is not None and cond.status == "True"
            reason = "" if ready or cond is None else cond.reason
        elif endpoint is not None:  # no status kept here (an API-only process): health decides
            ready = self.inventory.health(key).healthy
            phase = "Ready" if ready else "Unknown"
        return Row(
            key=key,
            pool=(endpoint.pool if endpoint else None) or "",
            provider=endpoint.provider if endpoint else "",
            stack=stack or ((endpoint.stack or "") if endpoint else ""),
            phase=phase,
            ready=ready,
            reason=reason,
        )
