"""The reconciler: the work queue's handler, one stack at a time.

A run reads the latest plan of its stack and takes the steps in order: forget what leaves with skip-cleanup,
destroy a stack nobody names any more, run `up` when the stack's hash differs from the applied one (also
after a restart: the applied hash is an output of the stack), release the proxies whose removal that `up`
completed, and run a due drift check. Each step is a short function; errors propagate to the queue, which
retries transient ones and parks permanent ones until the input changes.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from automation.engine import APPLIED_PROXIES_OUTPUT, HASH_OUTPUT, Engine, OperationResult, PreviewStep
from automation.errors import UnknownProviderError
from automation.planner import Planner, StackPlan
from automation.stack_input import CredentialSource, ResolvedStack, applied_proxies, resolve_stack
from stacks.models import Proxy

log = logging.getLogger(__name__)


class Reporter(Protocol):
    """Where the reconciler tells what happened: status, events, the inventory, the source."""

    def stack_applied(
        self, plan: StackPlan, *, outputs: dict[str, Any], result: OperationResult | None
    ) -> None: ...

    def stack_removed(self, name: str) -> None: ...

    def proxy_event(self, key: str, *, reason: str, message: str, warning: bool = False) -> None: ...

    def released(self, proxy: Proxy, *, forgotten: bool = False) -> None: ...

    def drift(self, name: str, steps: list[PreviewStep]) -> None: ...


@dataclass
class Reconciler:
    planner: Planner
    engine: Engine
    reporter: Reporter
    credentials: CredentialSource
    _applied: dict[str, str] = field(default_factory=dict)
    _outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    _drift_due: set[str] = field(default_factory=set)

    async def __call__(self, name: str) -> None:
        plan = self.planner.plan(name)
        if plan.forget:
            await self._forget(plan)
            plan = self.planner.plan(name)  # what is left once the forgotten proxies are released
        if not plan.referenced:
            await self._destroy(name)
            return
        if plan.entry is None:
            raise self._provider_missing(plan)
        resolved = resolve_stack(plan, self.credentials)
        for key, message in resolved.skipped.items():
            self.reporter.proxy_event(key, reason="CredentialsMissing", message=message, warning=True)
        drift_correct = name in self._drift_due and plan.entry.drift_policy == "correct"
        if drift_correct or resolved.input.spec_hash != await self._applied_hash(name):
            await self._up(plan, resolved, refresh=drift_correct)
        else:
            self.reporter.stack_applied(plan, outputs=self._outputs.get(name, {}), result=None)
        self._release(plan.deleting)
        if plan.deleting and not self.planner.plan(name).referenced:
            await self._destroy(name)  # the last proxies just left: nothing may stay behind
            return
        if name in self._drift_due:
            self._drift_due.discard(name)
            if plan.entry.drift_policy == "detect":
                self.reporter.drift(name, await asyncio.to_thread(self.engine.detect_drift, name))

    def request_drift_check(self, name: str) -> None:
        """Mark a stack for a drift check on its next run (the resync timer submits it to the queue)."""
        self._drift_due.add(name)

    # --- steps ------------------------------------------------------------------------------------------

    async def _forget(self, plan: StackPlan) -> None:
        """Skip-cleanup: drop the proxies' components from state, keep the real resources, release them."""
        keys = [proxy.key for proxy in plan.forget]
        forgotten = await asyncio.to_thread(self.engine.forget, plan.name, keys)
        for proxy in plan.forget:
            mine = forgotten.get(proxy.key, [])
            what = ", ".join(mine) if mine else "nothing (it was not in the stack's state)"
            self.reporter.proxy_event(
                proxy.key,
                reason="Forgotten",
                message=f"skip-cleanup: forgot from stack {plan.name} without deleting: {what}",
            )
        self._applied.pop(plan.name, None)  # the state changed under the applied hash
        self._release(plan.forget, forgotten=True)

    async def _destroy(self, name: str) -> None:
        result = await asyncio.to_thread(self.engine.destroy, name)
        self._applied.pop(name, None)
        self._outputs.pop(name, None)
        if result is not None:
            log.info(
                "destroyed and removed stack %s: %s", name, result.changes, extra={"fields": {"stack": name}}
            )
        self.reporter.stack_removed(name)

    async def _up(self, plan: StackPlan, resolved: ResolvedStack, *, refresh: bool) -> None:
        result = await asyncio.to_thread(self.engine.up, resolved.input, refresh=refresh)
        self._applied[plan.name] = resolved.input.spec_hash
        self._outputs[plan.name] = result.outputs
        self._drift_due.discard(plan.name)
        self.reporter.stack_applied(plan, outputs=result.outputs, result=result)

    async def _applied_hash(self, name: str) -> str | None:
        if name not in self._applied:
            outputs = await asyncio.to_thread(self.engine.plain_outputs, name)
            self._outputs[name] = outputs
            self._applied[name] = str(outputs.get(HASH_OUTPUT) or "")
            self.planner.remember_applied(applied_proxies(outputs.get(APPLIED_PROXIES_OUTPUT)))
        return self._applied[name] or None

    def _release(self, proxies: tuple[Proxy, ...], *, forgotten: bool = False) -> None:
        for proxy in proxies:
            self.planner.remove(proxy.key)
            self.reporter.released(proxy, forgotten=forgotten)

    def _provider_missing(self, plan: StackPlan) -> UnknownProviderError:
        message = (
            f"provider '{plan.name}' is not in the catalogue: restore the entry so these proxies can be "
            f"provisioned or removed, or annotate a deleting proxy with crawl.example.com/skip-cleanup: "
            f'"true" to forget its resources'
        )
        for proxy in plan.deleting:
            self.reporter.proxy_event(proxy.key, reason="ProviderMissing", message=message, warning=True)
        return UnknownProviderError(message)
