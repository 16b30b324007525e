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
import logging
import time
from collections.abc import Callable
from typing import Any

from automation.deletion_budget import DeletionBudget, HeldDeletion, assess
from automation.engine import Engine, OperationResult, PreviewStep, interrupt_children
from automation.errors import PermanentError, ProxyOperatorError, StackNotOwnedError
from automation.planner import Planner, StackPlan, is_deleting, wants_skip_cleanup
from automation.queue import WorkQueue
from automation.queue_state import QueueState, StackQueueState
from automation.reconciler import Reconciler
from service.config import OperatorSettings
from service.inventory import Inventory, ProxyEndpoint
from service.sources.contract import Hold, Source, SourceChange
from service.status import StatusBoard
from stacks.models import Address, Proxy
from stacks.models.conditions import ConditionType, Reason

log = logging.getLogger(__name__)


class Controller:
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
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.source = source
        self.inventory = inventory
        self.status = status or StatusBoard()
        self._on_publish = on_publish  # in a cluster: the credentials Secret of each published proxy
        self.planner = Planner()
        self.reconciler = Reconciler(
            planner=self.planner,
            engine=engine,
            reporter=self,
            credentials=source,
            installation=settings.installation_name(),
        )
        self.queue = WorkQueue(
            self.reconciler,
            policy=settings.backoff(),
            max_parallel=settings.max_parallel,
            stall_after=settings.stall_after,
            on_state_change=self._queue_state,
        )
        self.budget = DeletionBudget(
            max_share=settings.deletion_budget_share, min_count=settings.deletion_budget_count
        )
        self.held_deletion: HeldDeletion | None = None
        self._allowed: set[str] = set()
        self._pending_deletions: dict[str, Proxy] = {}
        self._source_holds: dict[str, Hold] = {}
        self._foreign: set[str] = set()
        self._backend_seen = False
        self.started = False
        self._monotonic = monotonic
        self._last_repair: dict[str, float] = {}
        self._applied_hash: dict[str, str] = {}  # key -> the spec hash its stack last applied
        self._forced = 0  # requested runs so far: part of their stacks' hints, so each one is a new input
        self.loop_error: str | None = None  # the last pass's failure, None while the loop is well
        self.wake = (
            asyncio.Event()
        )  # set (thread-safely, by the source) to poll now instead of at the next tick

    @property
    def backend_seen(self) -> bool:
        """The backend's stacks were read: what runs is known (nothing is planned before)."""
        return self._backend_seen

    # --- driving ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """First load: the source (for the catalogue that ownership is judged by), what the backend applied,
        the source again (absence judged against what runs); every known stack is submitted once."""
        self.sync()
        await self._load_backend()
        self.sync()
        await self._submit_known_stacks()
        self.started = True

    async def _load_backend(self) -> None:
        """Read every stack's ownership and applied proxies; the source learns the applied ones, so a
        complete read that lacks one declares its deletion and an incomplete one holds it."""
        try:
            names = await asyncio.to_thread(self.engine.list_stack_names)
            for name in names:
                try:
                    applied = await self.reconciler.load_stack(name)
                except StackNotOwnedError:
                    self._foreign.add(name)
                    continue
                except PermanentError as exc:  # this stack waits for a fix (its runs say why); others go on
                    log.error("stack %s: %s", name, exc.message, extra={"fields": {"stack": name}})
                    continue
                self.source.track(applied)
                self._publish_applied(name, applied)
                if self.reconciler.drift_check_due(name):
                    self._last_repair[name] = self._monotonic()  # its first run checks it already
        except ProxyOperatorError as exc:
            # The backend is unreachable or refuses us (credentials, passphrase): nothing is planned
            # without what it holds; tried again at the next poll.
            log.error("cannot list the stacks of the backend: %s", exc.message)
            return
        self._backend_seen = True
        for key in sorted(self.planner.rejected):  # a rejected proxy may run an applied version after all
            current = self.planner.current(key)
            if current is not None:
                self._report_validity(key, deleting=is_deleting(current))

    async def _submit_known_stacks(self) -> None:
        """Submit every stack of ours -- once the backend was read and there is a catalogue to judge by."""
        if not self._backend_seen:
            return
        if self.source.catalogue is None:
            log.error("no provider catalogue in the manifests yet: no stack is reconciled until there is one")
            return
        # A foreign stack our catalogue names is submitted too: its run fails, naming the owner.
        for name in sorted(self.planner.stacks()):
            self.queue.submit(name, generation_hint=self._hint(name))

    def sync(self) -> set[str]:
        """Poll the source once; feed the planner; submit what changed. Returns the dirty stacks."""
        change = self.source.poll()
        dirty: set[str] = set()
        if change.catalogue is not None:
            dirty |= self.planner.set_catalogue(change.catalogue)
        upserts = change.upserts.packed()  # one model at a time (see Upserts)
        for packed in upserts:
            self._pending_deletions.pop(packed.key, None)  # declared again: no longer leaving
            self.status.set_deleting(packed.key, False)
            dirty |= self.planner.upsert(packed)
        dirty |= self._apply_deletions(change.deletions)
        dirty |= self._requested_runs(change.requested)
        for packed in upserts:
            self._report_validity(packed.key, deleting=packed.deleting)
        for proxy in change.deletions:
            self._report_validity(proxy.key, deleting=is_deleting(proxy))
        if change.catalogue is not None or change.upserts or change.deletions or change.held:
            self._report_source_holds(change)
        if self._backend_seen and self.source.catalogue is not None:
            for name in sorted(dirty):
                self.queue.submit(name, generation_hint=self._hint(name))
        if not change.empty:
            self.inventory.mark_loaded()
        return dirty

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
        self.sync()

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
        self.reconciler.request_drift_check(stack)
        self.queue.submit(stack, generation_hint=("repair", now))
        return True

    def allow_deletions(self, change_id: str) -> bool:
        """Allow the held change with this id once (the deletion budget); False when no such change."""
        self._allowed.add(change_id)
        if self.held_deletion is None or self.held_deletion.change_id != change_id:
            return False
        dirty = self._apply_deletions([])
        if self._backend_seen:
            for name in sorted(dirty):
                self.queue.submit(name, generation_hint=self._hint(name))
        return True

    async def close(self, *, grace: float = 30.0) -> None:
        """Stop taking work; SIGINT running `pulumi` children so they cancel cleanly and unlock."""
        closing = asyncio.create_task(self.queue.close(grace=grace), name="queue-close")
        await asyncio.to_thread(interrupt_children, grace=grace)
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

    def _publish_applied(self, name: str, applied: list[Proxy]) -> None:
        """What a stack's outputs say runs is known (and served once probes pass) before any run: a fault
        that blocks every run, such as a missing catalogue, must not take running proxies out of discovery."""
        outputs = self.reconciler.applied_outputs(name)
        published = outputs.get("proxies") or {}
        credentials = outputs.get("credentials") or {}
        for proxy in applied:
            out = published.get(proxy.key)
            if out and out.get("host") and self.inventory.get(proxy.key) is None:
                creds = credentials.get(proxy.key) or {}
                self._publish(endpoint_of(proxy, stack=name, out=out, creds=creds))

    # --- deletions --------------------------------------------------------------------------------------

    def _apply_deletions(self, declared: list[Proxy]) -> set[str]:
        """Declared deletions pass the budget as one change with those still held; returns dirty stacks."""
        for proxy in declared:
            self._pending_deletions[proxy.key] = proxy
        if not self._pending_deletions:
            self.held_deletion = None
            return set()
        removing = [
            key
            for key, proxy in self._pending_deletions.items()
            if self.planner.is_applied(key) and not wants_skip_cleanup(proxy)
        ]
        held = assess(removing, fleet=self.planner.applied_count(), budget=self.budget, allowed=self._allowed)
        if held is not None:
            if self.held_deletion != held:
                self._report_held_deletion(held)
            self.held_deletion = held
            return set()
        self.held_deletion = None
        self._allowed.clear()  # an allowance covers one change: it is used up now
        dirty: set[str] = set()
        for proxy in self._pending_deletions.values():
            dirty |= self.planner.upsert(proxy)
        self._pending_deletions.clear()
        return dirty

    def _report_held_deletion(self, held: HeldDeletion) -> None:
        message = held.message(budget=self.budget)
        log.error("deletion budget: %s", message, extra={"fields": {"change": held.change_id}})
        for key in held.keys:
            self._hold(key, Hold(Reason.DELETION_HELD, message))

    # --- the reconciler's reporter ----------------------------------------------------------------------

    def stack_applied(
        self,
        plan: StackPlan,
        *,
        outputs: dict[str, Any],
        result: OperationResult | None,
        missing: set[str] | None = None,
        held: set[str] | None = None,
    ) -> None:
        published = outputs.get("proxies") or {}
        credentials = outputs.get("credentials") or {}
        for planned in plan.proxies:
            key, proxy = planned.key, planned.proxy  # decoded once: a plan holds packed proxies
            out = published.get(key)
            address = Address(host=out["host"], port=int(out["port"])) if out and out.get("host") else None
            self.status.set_applied(key, stack=plan.name, spec_hash=planned.spec_hash, address=address)
            if proxy.metadata.generation is not None:
                self.status.observe(key, generation=proxy.metadata.generation)
            if out is None or key in (missing or set()):
                continue  # left out, or its resources are gone (drift reported): claim nothing
            held_back = key in (held or set()) or self.planner.held_version(key) is not None
            if not held_back:
                self._applied_hash[key] = planned.spec_hash
            self._provisioned(key, stack=plan.name, held=held_back)
            if result is not None:
                log.info(
                    "%s serves at %s://%s:%s",
                    key,
                    out.get("protocol") or "http",
                    out["host"],
                    out["port"],
                    extra={"fields": {"proxy": key, "stack": plan.name}},
                )
            self._publish(endpoint_of(proxy, stack=plan.name, out=out, creds=credentials.get(key) or {}))
        if result is not None and result.changed:
            log.info(
                "stack %s applied: %s", plan.name, result.changes, extra={"fields": {"stack": plan.name}}
            )

    def _publish(self, endpoint: ProxyEndpoint) -> None:
        self.inventory.upsert(endpoint)
        if self._on_publish is not None:
            self._on_publish(endpoint)

    def stack_removed(self, name: str) -> None:
        for endpoint in self.inventory.endpoints():
            if endpoint.stack == name:
                self.inventory.remove(endpoint.key)
        self.queue.discard(name)

    def proxy_event(self, key: str, *, reason: str, message: str, warning: bool = False) -> None:
        self.status.event(key, reason=reason, message=message, warning=warning)

    def proxy_held(self, key: str, *, reason: str, message: str) -> None:
        self._hold(key, Hold(reason, message))

    def operation_started(self, plan: StackPlan, *, type_: str) -> None:
        for key in self._concerned(plan):
            self.status.operation_started(key, type_=type_)

    def operation_finished(self, plan: StackPlan, *, type_: str, error: str | None = None) -> None:
        for key in self._concerned(plan):
            self.status.operation_finished(key, type_=type_, succeeded=error is None, message=error or "")

    def _concerned(self, plan: StackPlan) -> list[str]:
        """The proxies a run of `plan` changes (new or changed since applied): the others' lastOperation
        stays, so a neighbour's change writes no status for them."""
        forced = self.reconciler.run_due(plan.name)  # not a drift check: a quiet resync writes nothing
        return [p.key for p in plan.proxies if forced or self._applied_hash.get(p.key) != p.spec_hash]

    def released(self, proxy: Proxy, *, forgotten: bool = False) -> None:
        self.source.release(proxy.key)
        self._applied_hash.pop(proxy.key, None)
        self.inventory.remove(proxy.key)
        self._source_holds.pop(proxy.key, None)
        message = (
            "forgotten from state, its resources kept (skip-cleanup); the proxy is released"
            if forgotten
            else "resources removed; the proxy is released"
        )
        self.status.event(proxy.key, reason=Reason.RELEASED, message=message)
        self.status.drop(proxy.key)

    def drift(self, name: str, steps: list[PreviewStep]) -> None:
        for proxy in sorted({s.proxy or "-" for s in steps}):
            what = ", ".join(f"{s.op} {s.type} {s.name}" for s in steps if (s.proxy or "-") == proxy)
            message = f"stack {name} differs from the real resources: {what}"
            self.status.event(proxy, reason=Reason.DRIFT_DETECTED, warning=True, message=message)
            if proxy != "-":
                self.status.set_condition(
                    proxy,
                    type_=ConditionType.PROVISIONED,
                    true=False,
                    reason=Reason.RESOURCES_MISSING,
                    message=message + " (driftPolicy detect: set driftPolicy: correct to restore them)",
                    warning=True,
                )

    # --- status -----------------------------------------------------------------------------------------

    def _provisioned(self, key: str, *, stack: str, held: bool) -> None:
        self.status.set_condition(
            key,
            type_=ConditionType.PROVISIONED,
            true=True,
            reason=Reason.PROVISIONED,
            message=f"applied in stack {stack}",
        )
        self.status.set_condition(key, type_=ConditionType.STALLED, true=False, reason=Reason.RECONCILED)
        if not held and key not in self._source_holds:
            self._unhold(key)

    def _hold(self, key: str, hold: Hold) -> None:
        self.status.set_condition(
            key, type_=ConditionType.HELD, true=True, reason=hold.reason, message=hold.message, warning=True
        )

    def _hold_or_fail(self, key: str, hold: Hold) -> None:
        """A version that could not be used: held when an earlier one runs or is planned, else Failed."""
        if self.planner.is_applied(key):
            self._hold(key, Hold(hold.reason, f"{hold.message}; its applied version keeps running"))
        elif self.planner.holds(key):
            self._hold(key, Hold(hold.reason, f"{hold.message}; its last valid version is used"))
        else:
            self.status.set_condition(
                key,
                type_=ConditionType.PROVISIONED,
                true=False,
                reason=hold.reason,
                message=hold.message,
                warning=True,
            )

    def _unhold(self, key: str) -> None:
        if _condition(self.status, key, ConditionType.HELD) == "True":
            self.status.set_condition(
                key,
                type_=ConditionType.HELD,
                true=False,
                reason=Reason.AS_DECLARED,
                message="the declared version is the one applied",
            )

    def _report_source_holds(self, change: SourceChange) -> None:
        for key, hold in change.held.items():
            self._hold_or_fail(key, hold)
        for key in set(self._source_holds) - set(change.held):
            if key not in self._pending_deletions and self.planner.held_version(key) is None:
                self._unhold(key)
        self._source_holds = dict(change.held)

    def _report_validity(self, key: str, *, deleting: bool) -> None:
        if self.source.catalogue is None:
            why = "no provider catalogue in the manifests: nothing is reconciled until there is one"
            self._hold_or_fail(key, Hold(Reason.MANIFEST_UNREADABLE, why))
            return
        if deleting:
            if key in self._pending_deletions:
                return  # held by the deletion budget: reported there
            self.status.set_deleting(key)
            self.status.event(key, reason=Reason.DELETING, message="removing its resources")
            return
        error = self.planner.rejected.get(key)
        if error is None:
            if key not in self._source_holds:
                self._unhold(key)
            if _condition(self.status, key, ConditionType.STALLED) == "True":
                self.status.set_condition(
                    key, type_=ConditionType.STALLED, true=False, reason=Reason.INPUT_CHANGED
                )
            return
        if self.planner.held_version(key) is not None:
            self._hold_or_fail(key, Hold(error.reason, error.message))
            return
        self.status.set_condition(
            key,
            type_=ConditionType.PROVISIONED,
            true=False,
            reason=error.reason,
            message=error.message,
            warning=True,
        )
        # Its input is wrong: nothing retries until it changes (Stalled), and the reason says what to fix.
        self.status.set_condition(
            key, type_=ConditionType.STALLED, true=True, reason=error.reason, message=error.message
        )

    def _queue_state(self, state: StackQueueState) -> None:
        if state.state not in (QueueState.STALLED, QueueState.FAILED) or state.last_error is None:
            return
        stalled = state.state is QueueState.STALLED
        error = state.last_error
        for planned in self.planner.plan(state.stack).proxies:
            self.status.set_condition(
                planned.key,
                # Stalled=True after N failures in a row; before that, Provisioned=False says why.
                type_=ConditionType.STALLED if stalled else ConditionType.PROVISIONED,
                true=stalled,
                reason=error.reason,
                message=error.message,
                warning=True,
            )


async def _first(*events: asyncio.Event, seconds: float) -> None:
    """Return when any of `events` is set, or after `seconds`."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def _condition(status: StatusBoard, key: str, type_: str) -> str | None:
    return next((c.status for c in status.get(key).conditions if c.type == type_), None)


def endpoint_of(
    proxy: Proxy, *, stack: str | None, out: dict[str, Any], creds: dict[str, Any]
) -> ProxyEndpoint:
    """The inventory's endpoint of a proxy from where it serves (`out`: host, port, protocol) and its
    credentials."""
    return ProxyEndpoint(
        key=proxy.key,
        namespace=proxy.metadata.namespace,
        name=proxy.metadata.name,
        provider=proxy.spec.provider,
        pool=proxy.spec.pool,
        labels=dict(proxy.metadata.labels),
        protocol=str(out.get("protocol") or proxy.spec.protocol),
        host=str(out["host"]),
        port=int(out["port"]),
        username=creds.get("username"),
        password=creds.get("password"),
        stack=stack,
        control=out.get("control"),  # local proxies: where lease users are pushed (docs/security.md)
    )
