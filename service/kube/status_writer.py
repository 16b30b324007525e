"""The StatusBoard written to each Proxy's status subresource, only when what it shows changed.

Steps, in a worker thread (the board is called from the asyncio loop and from threads; the client blocks):
1. the board's listener marks a key dirty (cheap, never blocks);
2. the worker takes the dirty keys in batches, half the most recently marked and half the longest waiting
   (many changes of one key make one write; a real change made while a new term writes its 10,000 first
   statuses goes ahead of them, and a steady inflow of newer marks holds no status back), writes a batch
   (`parallel` threads; one by default), looks up the live object (`lookup`: namespace, name, uid), and
   renders the board's published status as the CRD's JSON;
3. it compares with what it last wrote for that uid; for a uid it has not written yet, with the status the
   object has: as the watch last saw it (`known`), or one GET where no watched copy is given (the service
   always gives one, so deploy/rbac.yaml grants no `get` on proxies/status; after a
   restart an unchanged status is not written again, and each condition keeps the lastTransitionTime the
   object shows while its status is the same, and lastOperation and observedGeneration stay while the
   board knows nothing newer);
4. only a difference is written, as a JSON merge patch of exactly what differs (a field gone is a null).

A 404 (the object is gone) is dropped quietly; other failures are retried per key with the `backoff`
schedule and logged once per streak. Why a merge patch and not an update with resourceVersion:
docs/decisions.md ("Status in the cluster").
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes.client import ApiClient
from urllib3.exceptions import HTTPError as Urllib3Error

from service.kube.client import ApiException, request_json
from service.kube.refs import Lookup, ProxyRef
from service.kube.worker import Worker
from service.status import StatusBoard
from service.status_view import pack_status_json
from stacks.compact import STATUS_PACKER
from stacks.models import ProxyStatus

__all__ = ["StatusWriter", "merge_patch", "render"]

log = logging.getLogger(__name__)

Json = dict[str, Any]
NOT_FOUND = 404
MERGE_PATCH = "application/merge-patch+json"
HISTORY = ("lastOperation", "observedGeneration")
BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # seconds before the n-th retry of one key (the last repeats)
BATCH = 32  # keys taken at once: a key marked meanwhile waits for at most one batch
SETTLE = 0.1  # a key is written once it was not marked for this long: one change is several board calls
PARALLEL = (
    1  # writes in flight at once: 4 threads cost 25 MiB of RSS at 10,000 and starved the finalizer thread
)
Known = Callable[[str], Json | None]  # key -> the status the watch last saw (None: not watched, read it)


class StatusWriter(Worker):
    thread_name = "status-writer"

    def __init__(
        self,
        api: ApiClient,
        board: StatusBoard,
        lookup: Lookup,
        *,
        backoff: tuple[float, ...] = BACKOFF,
        monotonic: Callable[[], float] = time.monotonic,
        known: Known | None = None,
        known_packed: Callable[[str], bytes | None] = lambda _key: None,
        parallel: int = PARALLEL,
    ) -> None:
        super().__init__()
        self.api, self.board, self.lookup = api, board, lookup
        self.backoff, self.monotonic = backoff, monotonic
        self.known, self.parallel = known, parallel
        self.known_packed = known_packed  # the watched status packed as `_written` is: bytes shared
        self.writes = 0  # status writes sent (metrics, tests)
        self.reads = 0  # statuses read with a GET (no watched copy given)
        # uid -> the status last written (or read) for it: deflated JSON, one per Proxy (stacks/compact.py)
        self._written: dict[str, bytes] = {}
        self._uids: dict[str, str] = {}  # key -> uid, to forget what was written for a dropped key
        self._dirty: dict[str, float] = {}  # key -> when last marked, in marking order (the last first)
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        # Only a leader writes: a replica that stepped down writes nothing more, even what it had queued.
        self.leading: Callable[[], bool] = lambda: True

    def begin_term(self) -> None:
        """A new term of leadership: what was written in an earlier one may have been overwritten by
        another leader since, so each status is read again before it is compared; every key is marked."""
        with self._cond:
            self._written.clear()
            self._uids.clear()
        for key in self.board.tracked():
            self.mark(key)

    def start(self) -> None:
        """Listen to the board, and write what it holds now (a new leader brings the cluster up to date)."""
        self.board.subscribe(self.mark)
        self._start_thread()
        for key in self.board.tracked():
            self.mark(key)

    # close(): Worker's. The board keeps the listener (it cannot unsubscribe); after it, mark() fills a set.

    def mark(self, key: str) -> None:
        """The board's listener: the key's status may have changed."""
        with self._cond:
            idle = not self._dirty
            self._dirty.pop(key, None)
            self._dirty[key] = self.monotonic()
            if idle:  # else the worker looks again within SETTLE: 10,000 marks are not 10,000 wake-ups
                self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing is dirty nor being written; False on timeout (a key waiting for a retry)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._dirty and not self._busy, timeout)

    # --- the worker ---------------------------------------------------------------------------------------

    def _worker(self) -> None:
        pool = ThreadPoolExecutor(self.parallel, self.thread_name) if self.parallel > 1 else None
        try:
            while True:
                with self._cond:
                    keys = self._take()
                    if keys is None:
                        return
                    self._busy = True
                list(pool.map(self._sync, keys) if pool is not None else map(self._sync, keys))
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
        finally:
            if pool is not None:
                pool.shutdown()

    def _take(self) -> list[str] | None:
        """Up to BATCH dirty keys that are due, half the most recently marked and half the longest waiting
        (waiting under the lock); None when closing. The newest half puts a real change ahead of a bulk
        (a new term's 10,000 first statuses); the oldest half keeps a steady inflow of newer marks (10,000
        running proxies turning Healthy one after the other) from holding a status back for minutes, as
        newest-first alone did (12 of 10,000 Proxies showed "not applied yet" for 7 minutes after they
        served). A key is due once it settled (SETTLE s unmarked: a change of one Proxy is several board
        calls, and writing the first alone would write it twice) and its retry is due. Each scan passes
        only the unsettled and those waiting for a retry: a bulk of 10,000 costs a batch's worth per take."""
        while not self._stop:
            now = self.monotonic()
            due: dict[str, None] = {}  # in the order taken
            marks = self._dirty.items()
            for keys, limit in ((reversed(marks), BATCH // 2), (iter(marks), BATCH)):
                for key, marked in keys:
                    if len(due) >= limit:
                        break
                    if key not in due and marked <= now - SETTLE and self._retry_at.get(key, 0.0) <= now:
                        due[key] = None
            if due:
                for key in due:
                    del self._dirty[key]
                return list(due)
            self._cond.wait(SETTLE if self._dirty else None)
        return None

    def _sync(self, key: str) -> None:
        try:
            self._write(key)
        except ApiException as exc:
            if exc.status == NOT_FOUND:
                log.debug("%s is gone: its status is not written", key)
                self._forget(key)
                return
            self._failed(key, f"{exc.status} {exc.reason}")
        except (Urllib3Error, OSError, ValueError) as exc:
            self._failed(key, f"{type(exc).__name__}: {exc}")
        else:
            if self._failures.pop(key, 0):
                log.info("%s: status written again", key)
            with self._cond:
                self._retry_at.pop(key, None)

    def _write(self, key: str) -> None:
        if not self.leading():
            return  # a follower: the next term marks every key again (begin_term)
        ref, status = self.lookup(key), self.board.published(key)
        if ref is None or status is None:
            self._forget(key)
            return
        self._uids[key] = ref.uid
        packed = self._written.get(ref.uid)
        base = self._base(ref) if packed is None else json.loads(STATUS_PACKER.unpack(packed))
        rendered = keep_history(keep_transition_times(render(status), base), base)
        if rendered != base:
            request_json(
                self.api,
                "PATCH",
                ref.path("status"),
                body={"status": merge_patch(base, rendered)},
                content_type=MERGE_PATCH,
                timeout=(5, 30),
            )
            with self._cond:
                self.writes += 1
        packed = pack_status_json(rendered)
        watched = self.known_packed(key)
        self._written[ref.uid] = watched if watched == packed else packed  # one copy held for both

    def shared(self, key: str, packed: bytes) -> bytes:
        """`packed` (a status the watch read), or this writer's own copy when it is what the writer last
        wrote for that key (the watch reading a write back): the caller keeps that one, not a second."""
        uid = self._uids.get(key)
        written = self._written.get(uid) if uid is not None else None
        return written if written is not None and written == packed else packed

    def _base(self, ref: ProxyRef) -> Json:
        """The status the object has: the watched copy when there is one, else read."""
        watched = self.known(ref.key) if self.known is not None else None
        return watched if watched is not None else self._read(ref)

    def _read(self, ref: ProxyRef) -> Json:
        with self._cond:
            self.reads += 1
        live = request_json(self.api, "GET", ref.path("status"), timeout=(5, 30))
        status = live.get("status")
        return status if isinstance(status, dict) else {}

    def _forget(self, key: str) -> None:
        uid = self._uids.pop(key, None)
        if uid is not None:
            self._written.pop(uid, None)
        self._failures.pop(key, None)
        with self._cond:
            self._retry_at.pop(key, None)

    def _failed(self, key: str, message: str) -> None:
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        if failures == 1:
            log.warning("%s: cannot write its status (%s); retrying with backoff", key, message)
        delay = self.backoff[min(failures, len(self.backoff)) - 1]
        with self._cond:
            self._retry_at[key] = self.monotonic() + delay
            self._dirty.setdefault(key, 0.0)


def render(status: ProxyStatus) -> Json:
    """The status as the CRD's JSON (camelCase, absent fields left out)."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def keep_transition_times(rendered: Json, base: Json) -> Json:
    """Each condition keeps the lastTransitionTime of `base` while its status is the same."""
    before = {c.get("type"): c for c in base.get("conditions") or [] if isinstance(c, dict)}
    conditions = []
    for condition in rendered.get("conditions") or []:
        old = before.get(condition["type"])
        if old is not None and old.get("status") == condition["status"] and old.get("lastTransitionTime"):
            condition = {**condition, "lastTransitionTime": old["lastTransitionTime"]}
        conditions.append(condition)
    return {**rendered, "conditions": conditions} if "conditions" in rendered else rendered


def keep_history(rendered: Json, base: Json) -> Json:
    """What the object says happened (lastOperation, observedGeneration) stays while the board knows
    nothing newer: a restarted service starts with an empty board but the same history."""
    kept = {key: base[key] for key in HISTORY if key in base and key not in rendered}
    return {**rendered, **kept}


def merge_patch(old: Json, new: Json) -> Json:
    """The RFC 7386 merge patch that turns `old` into `new` (a removed field is null; lists are replaced)."""
    patch: Json = {key: None for key in old if key not in new}
    for key, value in new.items():
        previous = old.get(key)
        if isinstance(value, dict) and isinstance(previous, dict):
            nested = merge_patch(previous, value)
            if nested:
                patch[key] = nested
        elif value != previous:
            patch[key] = value
    return patch
