"""The control loop: source -> planner -> work queue -> reconciler, and what it reports back.

The controller owns the planner and the queue. Each poll of the source feeds changed proxies and the
catalogue to the planner and submits the stacks they dirtied; the reconciler (the queue's handler) runs
them; the controller, as the reconciler's reporter, publishes addresses to the inventory that discovery and
the health engine read, and records status and events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from automation.engine import Engine, OperationResult, PreviewStep, interrupt_children
from automation.errors import ProxyOperatorError
from automation.planner import Planner, StackPlan, is_deleting
from automation.queue import WorkQueue
from automation.queue_state import QueueState, StackQueueState
from automation.reconciler import Reconciler
from service.config import OperatorSettings
from service.inventory import Inventory, ProxyEndpoint
from service.sources.directory import DirectorySource
from service.status import Reason, StatusBoard
from stacks.models import Address, Proxy

log = logging.getLogger(__name__)


class Controller:
    def __init__(
        self,
        *,
        settings: OperatorSettings,
        engine: Engine,
        source: DirectorySource,
        inventory: Inventory,
        status: StatusBoard | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.source = source
        self.inventory = inventory
        self.status = status or StatusBoard()
        self.planner = Planner()
        self.reconciler = Reconciler(planner=self.planner, engine=engine, reporter=self, credentials=source)
        self.queue = WorkQueue(
            self.reconciler,
            policy=settings.backoff(),
            max_parallel=settings.max_parallel,
            stall_after=settings.stall_after,
            on_state_change=self._queue_state,
        )
        self._started = False
        self._backend_seen = False

    # --- driving ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """First load: every stack the manifests or the backend know is submitted once."""
        self.sync()
        self._started = True
        await self._submit_known_stacks()

    async def _submit_known_stacks(self) -> None:
        """Submit every stack of the backend and the manifests -- once there is a catalogue to judge by."""
        if self.source.catalogue is None:
            log.error("no provider catalogue in the manifests yet: no stack is reconciled until there is one")
            return
        try:
            existing = await asyncio.to_thread(self.engine.list_stack_names)
        except ProxyOperatorError as exc:
            # The backend is unreachable or refuses us (credentials, passphrase): retried at the next poll.
            log.error("cannot list the stacks of the backend: %s", exc.message)
            return
        for name in sorted(set(existing) | self.planner.stacks()):
            self.queue.submit(name, generation_hint=self._hint(name))
        self._backend_seen = True

    def sync(self) -> set[str]:
        """Poll the source once; feed the planner; submit what changed. Returns the dirty stacks."""
        change = self.source.poll()
        dirty: set[str] = set()
        if change.catalogue is not None:
            dirty |= self.planner.set_catalogue(change.catalogue)
        for proxy in change.upserts:
            dirty |= self.planner.upsert(proxy)
            self._report_validity(proxy)
        if self._started:
            for name in sorted(dirty):
                self.queue.submit(name, generation_hint=self._hint(name))
        if change.catalogue is not None or change.upserts:
            self.inventory.mark_loaded()
        return dirty

    async def run(self, stop: asyncio.Event) -> None:
        """Watch the source until `stop` is set; request drift checks every resync interval."""
        try:
            await self.start()
        except (OSError, ValueError) as exc:
            log.error("cannot read the manifests: %s", exc)  # tried again at every poll below
            self._started = True
        resync = self.settings.resync_seconds
        next_resync = asyncio.get_running_loop().time() + resync if resync else None
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.settings.poll_seconds)
            self._poll()
            if not self._backend_seen and self.source.catalogue is not None:
                await self._submit_known_stacks()  # the backend or the catalogue was not there yet
            if next_resync is not None and asyncio.get_running_loop().time() >= next_resync:
                self.request_resync()
                next_resync += resync

    def _poll(self) -> None:
        """`sync`, but a folder that cannot be read is logged and tried again at the next poll."""
        try:
            self.sync()
        except (OSError, ValueError) as exc:
            log.error("cannot read the manifests: %s", exc)

    def request_resync(self) -> None:
        for name, plan in self.planner.plan_all().items():
            if plan.entry is not None and plan.proxies:
                self.reconciler.request_drift_check(name)
                self.queue.submit(name, generation_hint=("resync", self._hint(name)))

    async def close(self, *, grace: float = 30.0) -> None:
        """Stop taking work; SIGINT running `pulumi` children so they cancel cleanly and unlock."""
        closing = asyncio.create_task(self.queue.close(grace=grace), name="queue-close")
        await asyncio.to_thread(interrupt_children, grace=grace)
        await closing

    def _hint(self, name: str) -> object:
        plan = self.planner.plan(name)
        return (plan.spec_hash, tuple(p.key for p in plan.deleting), tuple(p.key for p in plan.forget))

    # --- the reconciler's reporter ----------------------------------------------------------------------

    def stack_applied(
        self, plan: StackPlan, *, outputs: dict[str, Any], result: OperationResult | None
    ) -> None:
        published = outputs.get("proxies") or {}
        credentials = outputs.get("credentials") or {}
        for planned in plan.proxies:
            key = planned.key
            out = published.get(key)
            address = Address(host=out["host"], port=int(out["port"])) if out and out.get("host") else None
            self.status.set_applied(key, stack=plan.name, spec_hash=planned.spec_hash, address=address)
            if out is None or key in self.planner.rejected:
                continue  # left out, or running its last good version: the problem stays shown
            self.status.set_condition(
                key,
                type_="Provisioned",
                true=True,
                reason=Reason.PROVISIONED,
                message=f"applied in stack {plan.name}",
            )
            self.status.set_condition(key, type_="Stalled", true=False, reason="Reconciled")
            if self.inventory.get(key) is None or result is not None:
                log.info(
                    "%s serves at %s://%s:%s",
                    key,
                    out.get("protocol") or "http",
                    out["host"],
                    out["port"],
                    extra={"fields": {"proxy": key, "stack": plan.name}},
                )
            self.inventory.upsert(
                _endpoint(planned.proxy, stack=plan.name, out=out, creds=credentials.get(key) or {})
            )
        if result is not None and result.changed:
            log.info(
                "stack %s applied: %s", plan.name, result.changes, extra={"fields": {"stack": plan.name}}
            )

    def stack_removed(self, name: str) -> None:
        for endpoint in self.inventory.endpoints():
            if endpoint.stack == name:
                self.inventory.remove(endpoint.key)
        self.queue.discard(name)

    def proxy_event(self, key: str, *, reason: str, message: str, warning: bool = False) -> None:
        self.status.event(key, reason=reason, message=message, warning=warning)

    def released(self, proxy: Proxy, *, forgotten: bool = False) -> None:
        self.source.release(proxy.key)
        self.inventory.remove(proxy.key)
        message = (
            "forgotten from state, its resources kept (skip-cleanup); the proxy is released"
            if forgotten
            else "resources removed; the proxy is released"
        )
        self.status.event(proxy.key, reason="Released", message=message)
        self.status.drop(proxy.key)

    def drift(self, name: str, steps: list[PreviewStep]) -> None:
        if not steps:
            return
        for proxy in sorted({s.proxy or "-" for s in steps}):
            what = ", ".join(f"{s.op} {s.type} {s.name}" for s in steps if (s.proxy or "-") == proxy)
            self.status.event(
                proxy,
                reason="DriftDetected",
                warning=True,
                message=f"stack {name} differs from the real resources: {what}",
            )

    # --- status -----------------------------------------------------------------------------------------

    def _report_validity(self, proxy: Proxy) -> None:
        if is_deleting(proxy):
            self.status.event(proxy.key, reason=Reason.DELETING, message="removing its resources")
            return
        error = self.planner.rejected.get(proxy.key)
        if error is None:
            return
        kept = " (its last valid version stays applied)" if self.status.get(proxy.key).stack else ""
        self.status.set_condition(
            proxy.key,
            type_="Provisioned",
            true=False,
            reason=error.reason,
            message=error.message + kept,
            warning=True,
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
                type_="Stalled" if stalled else "Provisioned",
                true=stalled,
                reason=error.reason,
                message=error.message,
                warning=True,
            )


def _endpoint(proxy: Proxy, *, stack: str, out: dict[str, Any], creds: dict[str, Any]) -> ProxyEndpoint:
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
    )
