"""The control loop: source -> planner -> work queue -> reconciler, and what it reports back.

The controller owns the planner and the queue. At start it reads what the backend's stacks (ours only) last
applied, so nothing is planned without it; then each poll of the source feeds changed proxies, the catalogue
and the declared deletions to the planner and submits the stacks they dirtied. Deletions pass the deletion
budget first. The reconciler (the queue's handler) runs the stacks; the controller, as its reporter,
publishes addresses to the inventory that discovery and the health engine read, and records status and
events. The loop survives any error of one pass (logged with its traceback, tried again at the next poll).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from automation.deletion_budget import DeletionBudget, HeldDeletion
from automation.engine import Engine, Term
from automation.planner import Planner, wants_skip_cleanup
from automation.queue import WorkQueue
from automation.reconciler import Reconciler
from service.config import OperatorSettings
from service.deletions import Allowances, DeletionGate
from service.first_pass import FirstPass
from service.inventory import Inventory, ProxyEndpoint
from service.reporter import Reporter
from service.sources.contract import Hold, SlicedSource, Source
from service.status import StatusBoard
from stacks.models import Proxy
from stacks.models.conditions import Reason

log = logging.getLogger(__name__)

SLICE = 50  # Proxies judged between two turns of the event loop (10-25 ms of work on this machine)


class Controller(FirstPass):
    def __init__(
        self,
        *,
        settings: OperatorSettings,
        engine: Engine,
        source: Source,
        inventory: Inventory,
        status: StatusBoard | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        on_publish: Callable[[ProxyEndpoint], None] | None = None,
        term: Term | None = None,
        allowances: Allowances | None = None,
    ) -> None:
        self.settings = settings
        # Every CLI call of this controller belongs to its term: none starts once the term has ended, and
        # close() waits until the last one is gone (automation/engine/term.py).
        self.term = term or Term("controller")
        self.engine = engine.in_term(self.term)
        self.source = source
        self.inventory = inventory
        self.status = status or StatusBoard()
        self.planner = Planner()
        self.gate = DeletionGate(
            DeletionBudget(
                max_share=settings.deletion_budget_share, min_count=settings.deletion_budget_count
            ),
            monotonic=monotonic,
            allowances=allowances,
            quiet=settings.deletion_window_quiet_seconds,
            longest=settings.deletion_window_longest_seconds,
            horizon=settings.deletion_window_horizon_seconds,
        )
        self.reporter = Reporter(
            planner=self.planner,
            source=source,
            inventory=inventory,
            status=self.status,
            leaving=lambda key: key in self.gate.pending,
            on_publish=on_publish,
            on_released=lambda key: self.gate.allowances.released(key),
        )
        self.reconciler = Reconciler(
            planner=self.planner,
            engine=self.engine,
            reporter=self.reporter,
            credentials=source,
            installation=settings.installation_name(),
        )
        self.queue = WorkQueue(
            self.reconciler,
            policy=settings.backoff(),
            max_parallel=settings.max_parallel,
            stall_after=settings.stall_after,
            on_state_change=self.reporter.queue_state,
        )
        self.reporter.bind(run_due=self.reconciler.run_due, discard=self.queue.discard)
        self._foreign: set[str] = set()
        self._unread: set[str] = set()  # stacks whose read waits for a fix (a permanent error)
        self._reread_at = 0.0
        self._backend_seen = False
        self.started = False
        self._monotonic = monotonic
        self._last_repair: dict[str, float] = {}
        self._forced = 0  # requested runs so far: part of their stacks' hints, so each one is a new input
        self.loop_error: str | None = None  # the last pass's failure, None while the loop is well
        self.wake = asyncio.Event()  # set (thread-safely, by the source) to poll now, not at the next tick
        self._gate_timer: asyncio.TimerHandle | None = None
        self._reported_held: HeldDeletion | None = None
        self._lanes: set[asyncio.Task[None]] = set()  # lanes being read, then run (see _take_lane)
        self._reading: dict[str, asyncio.Future[list[Proxy] | None]] = {}  # stack reads under way

    @property
    def budget(self) -> DeletionBudget:
        return self.gate.budget

    @property
    def held_deletion(self) -> HeldDeletion | None:
        return self.gate.held

    @property
    def backend_seen(self) -> bool:
        """The backend's stacks were read: what runs is known (nothing is planned before)."""
        return self._backend_seen

    # --- driving ----------------------------------------------------------------------------------------

    def sync(self, *, only: Collection[str] | None = None, submit: bool = True) -> set[str]:
        """Poll the source once; feed the planner; submit what changed. Returns the dirty stacks. With
        `only`, a sliced source judges those keys alone (the rest wait for a later poll)."""
        return self._sync(only=only, limit=None, submit=submit)[0]

    async def _sync_slices(self, *, submit: bool = True) -> set[str]:
        """Poll until the source has judged every change, SLICE Proxies at a time, the event loop served
        between slices (a new term takes in 10,000); the stacks are submitted once, at the end."""
        if not isinstance(self.source, SlicedSource):
            return self.sync() if submit else self.sync(submit=False)
        dirty, more = self._sync(only=None, limit=SLICE, submit=False)
        while more:
            await asyncio.sleep(0)
            self._take_lane(self.source.urgent())  # a change made meanwhile goes ahead of the rest
            changed, more = self._sync(only=None, limit=SLICE, submit=False)
            dirty |= changed
        if submit:
            self._submit(dirty)
        return dirty

    def _sync(
        self, *, only: Collection[str] | None, limit: int | None, submit: bool
    ) -> tuple[set[str], bool]:
        if isinstance(self.source, SlicedSource) and (only is not None or limit is not None):
            change, more = self.source.poll_some(limit=limit, only=only)
        else:
            change, more = self.source.poll(), False
        dirty: set[str] = set()
        if change.catalogue is not None:
            dirty |= self.planner.set_catalogue(change.catalogue)
        upserts = change.upserts.packed()  # one model at a time (see Upserts)
        for packed in upserts:
            self.gate.withdraw(packed.key)  # declared again: no longer leaving
            self.status.set_deleting(packed.key, False)
            dirty |= self.planner.upsert(packed)
        dirty |= self._apply_deletions(change.deletions)
        dirty |= self._requested_runs(change.requested)
        for packed in upserts:
            self.reporter.report_validity(packed.key, deleting=packed.deleting, generation=packed.generation)
        if change.catalogue is not None or change.upserts or change.deletions or change.held or change.reread:
            self.reporter.report_source_holds(change)  # reread: a file restored unchanged ends its hold
        if submit:
            self._submit(dirty)
        if not change.empty:
            self.inventory.mark_loaded()
        self._wake_for_gate()
        return dirty, more

    def _submit(self, dirty: set[str]) -> None:
        if self._backend_seen and self.source.catalogue is not None:
            for name in sorted(dirty):
                self.queue.submit(name, generation_hint=self._hint(name))

    def _wake_for_gate(self) -> None:
        """Poll again when the deletion gate's quiet point comes (not at the next tick only)."""
        due = self.gate.due_in()
        if due is None:
            return
        with contextlib.suppress(RuntimeError):  # no running loop: a one-shot sync
            loop = asyncio.get_running_loop()
            if self._gate_timer is not None:
                self._gate_timer.cancel()
            self._gate_timer = loop.call_later(due + 0.01, self.wake.set)

    def _requested_runs(self, keys: set[str]) -> set[str]:
        """Stacks asked to run now (reconcile-requested-at, new credentials): `up` even if unchanged."""
        stacks = {self.planner.stack_of(key) for key in keys} - {None} - self._foreign
        for name in stacks:
            assert name is not None
            self.reconciler.request_run(name)
            self._forced += 1
        return {name for name in stacks if name is not None}

    async def run(self, stop: asyncio.Event) -> None:
        """Watch the source until `stop` is set; request drift checks every resync interval. A pass that
        fails is logged with its traceback and tried again; `loop_error` says so meanwhile (/readyz)."""
        loop = asyncio.get_running_loop()
        await self._pass(self.start)
        resync = self.settings.resync_seconds
        next_resync = loop.time() + resync if resync else None
        while not stop.is_set():
            await _first(stop, self.wake, seconds=self.settings.poll_seconds)
            self.wake.clear()
            await self._pass(self._poll_once)
            if next_resync is not None and loop.time() >= next_resync:
                self.request_resync()
                next_resync += resync

    async def _poll_once(self) -> None:
        if not self._backend_seen:
            await self.start()  # the backend (or the folder) was not usable yet
            return
        await self._reread()
        await self._sync_slices()

    async def _pass(self, step: Callable[[], Any]) -> None:
        try:
            await step()
        except (OSError, ValueError) as exc:
            self._loop_failed(f"cannot read the manifests: {exc}", traceback=False)
        except Exception as exc:  # the loop must never die silently
            self._loop_failed(f"the control loop failed: {type(exc).__name__}: {exc}", traceback=True)
        else:
            if self.loop_error is not None:
                log.info("the control loop recovered")
            self.loop_error = None

    def _loop_failed(self, message: str, *, traceback: bool) -> None:
        self.loop_error = message
        if traceback:
            log.exception("%s (tried again at the next poll)", message)
        else:
            log.error("%s (tried again at the next poll)", message)

    def request_resync(self) -> None:
        for name, plan in self.planner.plan_all().items():
            if plan.entry is not None and plan.proxies and name not in self._foreign:
                self.reconciler.request_drift_check(name)
                self.queue.submit(name, generation_hint=("resync", self._hint(name)))

    def request_repair(self, key: str) -> bool:
        """A proxy fails its probes: refresh its stack soon (drift policy decides: recreate or report),
        at most once per `repair_interval_seconds` per stack (a dead echo endpoint fails every probe)."""
        stack = self.status.get(key).stack
        if stack is None or stack in self._foreign:
            return False
        now = self._monotonic()
        last = self._last_repair.get(stack)
        if last is not None and now - last < self.settings.repair_interval_seconds:
            return False
        self._last_repair[stack] = now
        log.info("%s fails its probes: checking stack %s against its resources", key, stack)
        self.reconciler.request_drift_check(stack, refresh=True)  # its process may run and still be wrong
        self.queue.submit(stack, generation_hint=("repair", now))
        return True

    def allow_deletions(self, change_id: str) -> bool:
        """Allow the held change with this id once (the deletion budget); False, recording nothing, when
        no such change is held."""
        if not self.gate.allow(change_id):
            return False
        dirty = self._apply_deletions([])
        if self._backend_seen:
            for name in sorted(dirty):
                self.queue.submit(name, generation_hint=self._hint(name))
        return True

    async def close(self, *, grace: float = 30.0) -> None:
        """Stop taking work and end the term: no operation starts any more, running `pulumi` children get
        SIGINT (they cancel cleanly and unlock; killed after `grace`), and this returns once none is left."""
        self.term.close()
        if self._gate_timer is not None:
            self._gate_timer.cancel()
        for lane in list(self._lanes):
            lane.cancel()
        closing = asyncio.create_task(self.queue.close(grace=grace), name="queue-close")
        await asyncio.to_thread(self.term.end, grace=grace)
        await closing

    def _hint(self, name: str) -> object:
        plan = self.planner.plan(name)
        forced = self._forced if self.reconciler.run_due(name) else 0
        return (
            plan.spec_hash,
            tuple(p.key for p in plan.deleting),
            tuple(p.key for p in plan.forget),
            forced,
        )

    # --- deletions --------------------------------------------------------------------------------------

    def _apply_deletions(self, declared: list[Proxy]) -> set[str]:
        """Declared deletions pass the deletion gate (the budget over a window, service/deletions.py);
        returns the stacks dirtied by those let through."""
        if declared:  # the fleet is counted for a window alone: a walk of every applied proxy
            self.gate.declare(declared, fleet=self.planner.applied_count())
        self.gate.tick()
        passing, held = self.gate.judge(
            removes=lambda proxy: self.planner.is_applied(proxy.key) and not wants_skip_cleanup(proxy)
        )
        if held is not None and held != self._reported_held:
            self._report_held_deletion(held)
        self._reported_held = held
        dirty: set[str] = set()
        for proxy in passing:
            dirty |= self.planner.upsert(proxy)
        for proxy in passing:
            self.reporter.report_validity(proxy.key, deleting=True)
        return dirty

    def _report_held_deletion(self, held: HeldDeletion) -> None:
        message = held.message(budget=self.budget)
        log.error("deletion budget: %s", message, extra={"fields": {"change": held.change_id}})
        for key in held.keys:
            self.reporter.hold(key, Hold(Reason.DELETION_HELD, message))


async def _first(*events: asyncio.Event, seconds: float) -> None:
    """Return when any of `events` is set, or after `seconds`."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
