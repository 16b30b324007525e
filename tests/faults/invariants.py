"""The invariants, checked by a watcher thread all along and at the end of every sequence.

- overlap: never two lock-taking Pulumi calls on one stack at once (tests/faults/record.py).
- undeclared-destroy: a Proxy the campaign did not delete keeps the process first seen serving its port.
- budget-bypassed: a mass deletion (more than the deletion budget) destroyed a proxy before the campaign
  allowed the change.
- released-early: a deleted Proxy's object was gone while its process still ran (finalizer removed before
  the resources).
- deletion-stuck / process-outlived / skip-cleanup-ignored / forgotten-urn-kept: every declared deletion
  ends within the bound: object gone, process gone (a skip-cleanup one: still running and out of state).
- not-ready: a live Proxy is not Ready with its process by the end of the sequence's bound.
- replica-exit / unclean-exit / stray-pulumi: a replica exited on its own, a SIGTERM did not end in exit 0,
  a `pulumi` process of a dead replica is still running.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from tests.faults.record import Record, overlaps
from tests.faults.replicas import ReplicaSet, cmdline
from tests.faults.world import World, listeners

HOLD_WINDOW = 8.0  # seconds after a mass deletion during which the campaign does not allow it


# As the campaign's replicas are configured (campaign.py): PROXY_OPERATOR_DELETION_BUDGET_COUNT=2, share 0.5.
BUDGET_COUNT, BUDGET_SHARE = 2, 0.5


class Watcher:
    """Every 0.5 s: baselines and undeclared destroys, early releases, budget bypasses, replica exits; and,
    as the operator on call, allowing held deletions (after the hold window of a mass deletion)."""

    def __init__(self, world: World, replicas: ReplicaSet, record: Record) -> None:
        self.world, self.replicas, self.record = world, replicas, record
        self.reported_overlaps: set[tuple[int, float, int, float]] = set()
        self.final = False  # the last check: calls still running are judged too
        self.allowed: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="invariants", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.tick()
            except Exception as exc:
                self.world.note(f"watcher: {exc!r}")

    def tick(self) -> None:
        objects = self.world.objects()
        ports = listeners()
        now = time.time()
        for tracked in list(self.world.proxies.values()):
            if tracked.port is None:
                continue
            pid = ports.get(tracked.port)
            obj = objects.get(tracked.name) if objects is not None else None
            if tracked.deleted is None:
                if tracked.pid is None and pid is not None and self.world.ready(obj):
                    tracked.pid = pid
                elif tracked.pid is not None and pid != tracked.pid:
                    what = "gone" if pid is None else f"replaced by pid {pid}"
                    self.world.violate("undeclared-destroy",
                                       f"{tracked.name} (not deleted) had pid {tracked.pid} on port "
                                       f"{tracked.port}: {what}", tracked)  # fmt: skip
                continue
            if objects is not None and obj is None and tracked.gone is None:
                tracked.gone = now
                if not tracked.skip_cleanup and pid is not None and pid == tracked.pid:
                    self.world.violate("released-early",
                                       f"{tracked.name} released (object gone {now - tracked.deleted:.1f} s "
                                       f"after its deletion) while its process {pid} still serves port "
                                       f"{tracked.port}", tracked)  # fmt: skip
            mass = self.world.masses[tracked.mass] if tracked.mass is not None else None
            if mass is not None and mass.allowed is None and tracked.pid is not None and pid is None:
                mass.removed_unallowed.add(tracked.name)
                free = mass.free(count=BUDGET_COUNT, share=BUDGET_SHARE)
                if len(mass.removed_unallowed) > free:
                    self.world.violate("budget-bypassed",
                                       f"{tracked.name} destroyed {now - mass.started:.1f} s into mass "
                                       f"deletion #{mass.number} ({len(mass.names)} of {mass.fleet}): "
                                       f"{len(mass.removed_unallowed)} removed before any allowance, the "
                                       f"budget lets {free} go", tracked)  # fmt: skip
        self.allow_held()
        self.check_overlaps()
        for replica in self.replicas.replicas:
            if not replica.expected_exit and not replica.alive():
                replica.expected_exit = True
                self.world.violate("replica-exit",
                                   f"{replica.identity} exited by itself with {replica.process.returncode}:\n"
                                   f"{replica.tail(12)}")  # fmt: skip

    def check_overlaps(self) -> None:
        """Judged once both calls ended: a call that overlapped in time may yet turn out refused at the
        lock (it took none). The sequence's last check (`final`) judges the ones still running too."""
        for pair in overlaps(self.record.calls()):
            if not self.final and (pair.first.end is None or pair.second.end is None):
                continue
            key = (pair.first.pid, pair.first.start, pair.second.pid, pair.second.start)
            if key not in self.reported_overlaps:
                self.reported_overlaps.add(key)
                self.world.violate("overlap", pair.describe())

    def allow_held(self) -> None:
        """The human on call: the change the leader's budget holds (`GET /v1/deletions`) is allowed
        (`POST /v1/deletions/<id>/allow`) once no mass deletion is in its hold window (so the campaign sees
        whether the budget holds one)."""
        now = time.time()
        if any(m.allowed is None and now - m.started < HOLD_WINDOW for m in self.world.masses):
            return
        leader = self.replicas.leader()
        if leader is None:
            return
        url, token = f"http://127.0.0.1:{leader.port}/v1/deletions", leader.dev_token()
        headers = {"Authorization": f"Bearer {token}"}
        try:
            held = (httpx.get(url, headers=headers, timeout=5).json() or {}).get("held")
            if not held or held["changeId"] in self.allowed:
                return
            change = held["changeId"]
            response = httpx.post(f"{url}/{change}/allow", headers=headers, timeout=5)
        except (httpx.HTTPError, OSError, ValueError, KeyError):
            return
        self.world.note(f"allowed held deletion {change} ({len(held.get('proxies') or [])} proxies) on "
                        f"{leader.identity}: {response.status_code}")  # fmt: skip
        if response.status_code < 300:
            self.allowed.add(change)
            for mass in self.world.masses:
                mass.allowed = mass.allowed or now


def settle(world: World, replicas: ReplicaSet, *, bound: float) -> None:
    """After the last fault of a sequence: wait up to `bound` for every declared deletion to end and every
    live Proxy to be Ready, then report what did not."""
    deadline = world.last_fault + bound
    while time.time() < deadline:
        if not pending(world):
            break
        time.sleep(1)
    objects = world.objects() or {}
    ports = listeners()
    for tracked in list(world.proxies.values()):
        pid = ports.get(tracked.port or 0)
        obj = objects.get(tracked.name)
        if tracked.deleted is None:
            if tracked.port is not None and not (world.ready(obj) and pid is not None):
                world.violate("not-ready", f"{tracked.name} ({tracked.provider}) not Ready with a process "
                              f"{bound:.0f} s after the last fault: {_status(obj)}", tracked)  # fmt: skip
            continue
        if obj is not None:
            ago = time.time() - tracked.deleted
            world.violate("deletion-stuck", f"{tracked.name} deleted {ago:.0f} s ago still there: "
                          f"{_status(obj)}", tracked)  # fmt: skip
            continue
        if tracked.port is None or tracked.pid is None:
            continue
        if tracked.skip_cleanup:
            if tracked.alive_when_annotated and pid != tracked.pid:  # it ran when it was marked
                world.violate("skip-cleanup-ignored",
                              f"{tracked.name} (skip-cleanup) released but its process {tracked.pid} "
                              f"was destroyed", tracked)  # fmt: skip
            urns = world.state_urns(tracked.provider) or []
            kept = [u for u in urns if u.endswith(f"::{world.namespace}/{tracked.name}")]
            if kept:
                world.violate("forgotten-urn-kept", f"{tracked.name} released with skip-cleanup but still in "
                              f"the state of stack {tracked.provider}: {kept[0]}", tracked)  # fmt: skip
        elif pid is not None and pid == tracked.pid:
            world.violate("process-outlived", f"{tracked.name} released but its process {pid} still serves "
                          f"port {tracked.port}", tracked)  # fmt: skip


def pending(world: World) -> bool:
    objects = world.objects()
    if objects is None:
        return True
    ports = listeners()
    for tracked in world.proxies.values():
        obj = objects.get(tracked.name)
        if tracked.deleted is not None and obj is not None:
            return True
        live = tracked.deleted is None and tracked.port is not None
        if live and (not world.ready(obj) or ports.get(tracked.port or 0) is None):
            return True
    return False


def strays(world: World, replicas: ReplicaSet) -> None:
    """No `pulumi` process of a replica that is dead."""
    for replica in replicas.replicas:
        if replica.alive():
            continue
        for pid in replica.processes():
            if "pulumi" in cmdline(pid):
                world.violate("stray-pulumi", f"pid {pid} `{cmdline(pid)[:120]}` of dead {replica.identity}")


def _status(obj: dict[str, Any] | None) -> str:
    if obj is None:
        return "object gone"
    status = obj.get("status") or {}
    shown = [
        c for c in status.get("conditions") or [] if c.get("status") == "True" or c.get("type") == "Ready"
    ]
    conditions = "; ".join(
        f"{c.get('type')}={c.get('status')} {c.get('reason')}: {(c.get('message') or '')[:160]}"
        for c in shown
    )
    deleting = " deleting" if obj["metadata"].get("deletionTimestamp") else ""
    return f"phase {status.get('phase')}{deleting}; {conditions}"
