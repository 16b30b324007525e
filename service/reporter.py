"""The control loop's reporter: what the reconciler and the loop tell, made into status, events, the
inventory and the source's releases.

Kept apart from the loop (`service.controller`): the loop decides what runs; this says what happened.
Every proxy's conditions come from here (Provisioned, Stalled, Held), the inventory's endpoints that
discovery and the health engine read, and the release of a deleted proxy back to its source.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any

from automation.engine import OperationResult, PreviewStep
from automation.planner import Planner, StackPlan
from automation.queue_state import QueueState, StackQueueState
from service.inventory import NO_LABELS, Inventory, ProxyEndpoint, interned
from service.sources.contract import Hold, Source, SourceChange
from service.status import StatusBoard
from stacks.forward_proxy.channel import TCP_SCHEME
from stacks.models import Address, Proxy
from stacks.models.conditions import ConditionType, Reason

log = logging.getLogger(__name__)
SLICE = 50  # proxies reported between two turns of the event loop (about 50 ms)


class Reporter:
    def __init__(
        self,
        *,
        planner: Planner,
        source: Source,
        inventory: Inventory,
        status: StatusBoard,
        leaving: Callable[[str], bool],
        on_publish: Callable[[ProxyEndpoint], None] | None = None,
        on_released: Callable[[str], None] = lambda _key: None,
    ) -> None:
        self.planner = planner
        self.source = source
        self.inventory = inventory
        self.status = status
        self._leaving = leaving  # is this proxy's deletion waiting at the deletion gate?
        self._on_publish = on_publish  # in a cluster: the credentials Secret of each published proxy
        self._on_released = on_released  # a deletion allowance is used up as its proxies are released
        self._source_holds: dict[str, Hold] = {}
        self._applied_hash: dict[str, str] = {}  # key -> the spec hash its stack last applied
        self._run_due: Callable[[str], bool] = lambda _name: False  # set once the reconciler exists
        self._discard: Callable[[str], object] = lambda _name: None  # set once the queue exists

    def bind(self, *, run_due: Callable[[str], bool], discard: Callable[[str], object]) -> None:
        self._run_due, self._discard = run_due, discard

    async def stack_applied(
        self,
        plan: StackPlan,
        *,
        outputs: dict[str, Any],
        result: OperationResult | None,
        missing: set[str] | None = None,
        held: set[str] | None = None,
    ) -> None:
        """Status, the inventory and the credentials of every proxy of an applied stack, SLICE at a time
        with the event loop free between two slices: a proxy's status is unpacked, changed and packed again
        several times here (about 1 ms), and 500 at once held the loop 0.5-2 s after every `up` and every
        resync's check (the stall watch in bench_running, docs/operations.md run 37)."""
        published = outputs.get("proxies") or {}
        credentials = outputs.get("credentials") or {}
        for done, planned in enumerate(plan.proxies, 1):
            if done % SLICE == 0:
                await asyncio.sleep(0)
            key, proxy = planned.key, planned.proxy  # decoded once: a plan holds packed proxies
            out = published.get(key)
            address = Address(host=out["host"], port=int(out["port"])) if out and out.get("host") else None
            self.status.set_applied(key, stack=plan.name, spec_hash=planned.spec_hash, address=address)
            if proxy.metadata.generation is not None:
                self.status.observe(key, generation=proxy.metadata.generation)
            if out is None or key in (missing or set()):
                continue  # left out, or its resources are gone (drift reported): claim nothing
            held_back = key in (held or set()) or self.planner.held_version(key) is not None
            # a held proxy keeps its old applied hash, so it would read as new after every `up`: its
            # line is at DEBUG (the hold has a condition of its own)
            new_here = not held_back and self._applied_hash.get(key) != planned.spec_hash
            if not held_back:
                self._applied_hash[key] = planned.spec_hash
            self._provisioned(key, stack=plan.name, held=held_back)
            if result is not None:
                # A line for what this run made or changed; the stack's other proxies only at DEBUG (an
                # `up` of one change in a stack of 500 wrote 500 lines).
                log.log(
                    logging.INFO if new_here else logging.DEBUG,
                    "%s serves at %s://%s:%s",
                    key,
                    out.get("protocol") or "http",
                    out["host"],
                    out["port"],
                    extra={"fields": {"proxy": key, "stack": plan.name}},
                )
            self.publish(endpoint_of(proxy, stack=plan.name, out=out, creds=credentials.get(key) or {}))
        if result is not None and result.changed:
            log.info(
                "stack %s applied: %s", plan.name, result.changes, extra={"fields": {"stack": plan.name}}
            )

    def publish_applied(self, name: str, applied: list[Proxy], outputs: dict[str, Any]) -> None:
        """What a stack's outputs say runs is known (and served once probes pass) before any run: a fault
        that blocks every run, such as a missing catalogue, must not take running proxies out of discovery."""
        published = outputs.get("proxies") or {}
        credentials = outputs.get("credentials") or {}
        for proxy in applied:
            out = published.get(proxy.key)
            if out and out.get("host") and self.inventory.get(proxy.key) is None:
                creds = credentials.get(proxy.key) or {}
                self.publish(endpoint_of(proxy, stack=name, out=out, creds=creds))

    def publish(self, endpoint: ProxyEndpoint) -> None:
        self.inventory.upsert(endpoint)
        if self._on_publish is not None:
            self._on_publish(endpoint)

    def stack_removed(self, name: str) -> None:
        for endpoint in self.inventory.endpoints():
            if endpoint.stack == name:
                self.inventory.remove(endpoint.key)
        self._discard(name)

    def proxy_event(self, key: str, *, reason: str, message: str, warning: bool = False) -> None:
        self.status.event(key, reason=reason, message=message, warning=warning)

    def proxy_held(self, key: str, *, reason: str, message: str) -> None:
        self.hold(key, Hold(reason, message))

    def operation_started(self, plan: StackPlan, *, type_: str) -> None:
        for key in self._concerned(plan):
            self.status.operation_started(key, type_=type_)

    def operation_finished(self, plan: StackPlan, *, type_: str, error: str | None = None) -> None:
        for key in self._concerned(plan):
            self.status.operation_finished(key, type_=type_, succeeded=error is None, message=error or "")

    def _concerned(self, plan: StackPlan) -> list[str]:
        """The proxies a run of `plan` changes (new or changed since applied): the others' lastOperation
        stays, so a neighbour's change writes no status for them."""
        forced = self._run_due(plan.name)  # not a drift check: a quiet resync writes nothing
        return [p.key for p in plan.proxies if forced or self._applied_hash.get(p.key) != p.spec_hash]

    def released(self, proxy: Proxy, *, forgotten: bool = False) -> None:
        self.source.release(proxy.key)
        self._on_released(proxy.key)
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

    def hold(self, key: str, hold: Hold) -> None:
        self.status.set_condition(
            key, type_=ConditionType.HELD, true=True, reason=hold.reason, message=hold.message, warning=True
        )

    def _hold_or_fail(self, key: str, hold: Hold) -> None:
        """A version that could not be used: held when an earlier one runs or is planned, else Failed."""
        if self.planner.is_applied(key):
            self.hold(key, Hold(hold.reason, f"{hold.message}; its applied version keeps running"))
        elif self.planner.holds(key):
            self.hold(key, Hold(hold.reason, f"{hold.message}; its last valid version is used"))
        else:
            self._not_provisioned(key, reason=hold.reason, message=hold.message)

    def _not_provisioned(self, key: str, *, reason: str, message: str) -> None:
        self.status.set_condition(
            key, type_=ConditionType.PROVISIONED, true=False, reason=reason, message=message, warning=True
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

    def report_source_holds(self, change: SourceChange) -> None:
        for key, hold in change.held.items():
            self._hold_or_fail(key, hold)
        for key in set(self._source_holds) - set(change.held):
            if not self._leaving(key) and self.planner.held_version(key) is None:
                self._unhold(key)
        self._source_holds = dict(change.held)

    def report_validity(self, key: str, *, deleting: bool, generation: int | None = None) -> None:
        """Say whether the proxy as declared (its `generation`) can be planned: refused and never applied,
        its status describes that generation (observedGeneration: a new leader need not take it in first)."""
        if self.source.catalogue is None:
            why = "no provider catalogue in the manifests: nothing is reconciled until there is one"
            self._hold_or_fail(key, Hold(Reason.MANIFEST_UNREADABLE, why))
            return
        if deleting:
            if self._leaving(key):
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
        self._not_provisioned(key, reason=error.reason, message=error.message)
        if generation is not None:
            self.status.observe(key, generation=generation)
        # Its input is wrong: nothing retries until it changes (Stalled), and the reason says what to fix.
        self.status.set_condition(
            key, type_=ConditionType.STALLED, true=True, reason=error.reason, message=error.message
        )

    def queue_state(self, state: StackQueueState) -> None:
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


def _condition(status: StatusBoard, key: str, type_: str) -> str | None:
    return next((c.status for c in status.get(key).conditions if c.type == type_), None)


def endpoint_of(
    proxy: Proxy, *, stack: str | None, out: dict[str, Any], creds: dict[str, Any]
) -> ProxyEndpoint:
    """The inventory's endpoint of a proxy from where it serves (`out`: host, port, protocol) and its
    credentials."""
    control = out.get("control")
    labels = proxy.metadata.labels
    # The values that repeat across the fleet (namespace, provider, protocol, stack, a shared host, a
    # shared listener's instance id and control socket) are interned and no labels is one shared mapping:
    # 10,000 endpoints then hold one copy of each. The name and the credentials are interned too, so the
    # watched copy's name and the credentials Secrets' copies are the same strings (a census at 10,000
    # running found 3.3 MiB of equal strings held apart: tests/bench/census.py).
    return ProxyEndpoint(
        key=proxy.key,
        namespace=sys.intern(proxy.metadata.namespace),
        name=sys.intern(proxy.metadata.name),
        provider=sys.intern(proxy.spec.provider),
        pool=proxy.spec.pool,
        labels=dict(labels) if labels else NO_LABELS,
        protocol=sys.intern(str(out.get("protocol") or proxy.spec.protocol)),
        host=sys.intern(str(out["host"])),
        port=int(out["port"]),
        username=interned(creds.get("username")),
        password=interned(creds.get("password")),
        stack=sys.intern(stack) if stack is not None else None,
        control=interned(control),  # where lease users are pushed (docs/security.md)
        instance_id=sys.intern(str(out["instanceId"])) if out.get("instanceId") else None,
        # The local program exports the key on every endpoint (a socket path, None without credentials);
        # proxy pods only with a channel, always `tcp://` (stacks/programs/kube_control.py).
        local="control" in out and not str(control).startswith(TCP_SCHEME),
    )
