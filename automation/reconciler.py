"""The reconciler: the work queue's handler, one stack at a time.

A run first makes sure the stack is ours (see `automation.ownership`) and that what it last applied is known
(its outputs: the applied hash, the applied proxies and their credentials, read once and fed to the planner
before anything is planned, so a restart never plans without them). Then it reads the latest plan of its
stack and takes the steps in order: forget what leaves with skip-cleanup, destroy a stack nobody names any
more, run `up` when the stack's hash differs from the applied one, release the proxies whose removal that
`up` completed, and run a due drift check. Each step is a short function; errors propagate to the queue,
which retries transient ones and parks permanent ones until the input changes. Each `up` and `destroy`
leaves its record in `updates` (automation/last_update.py), which the fleet page reads.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from automation import local_drift
from automation.engine import (
    APPLIED_PROXIES_OUTPUT,
    CREDENTIALS_OUTPUT,
    HASH_OUTPUT,
    Engine,
    OperationResult,
    PreviewStep,
)
from automation.errors import InvalidInputError, StackNotOwnedError, UnknownProviderError
from automation.last_update import LastUpdate, UpdateLog
from automation.ownership import Ownership, not_owned_message, ownership
from automation.planner import Planner, StackPlan
from automation.stack_input import (
    CredentialSource,
    ResolvedStack,
    applied_proxies,
    resolve_stack,
    unreadable_applied,
)
from automation.stack_outputs import StackOutputs
from stacks.models import Proxy
from stacks.models.conditions import Reason

log = logging.getLogger(__name__)
# What a report reads of a stack's outputs (each proxy's address and its credentials): a run with no `up`
# decodes its stack's outputs and keeps only these while it reports (the applied proxies are most of them)
REPORTED_OUTPUTS = (local_drift.PROXIES_OUTPUT, CREDENTIALS_OUTPUT)


class Reporter(Protocol):
    """Where the reconciler tells what happened: status, events, the inventory, the source."""

    async def stack_applied(
        self,
        plan: StackPlan,
        *,
        outputs: dict[str, Any],
        result: OperationResult | None,
        missing: set[str] | None = None,
        held: set[str] | None = None,
    ) -> None:
        """Every proxy of the stack as applied; lets the event loop run between slices of them. `outputs`:
        the stack's outputs, at least those in REPORTED_OUTPUTS (a run with no `up` passes only those)."""
        ...

    def stack_removed(self, name: str) -> None: ...

    def proxy_event(self, key: str, *, reason: str, message: str, warning: bool = False) -> None: ...

    def released(self, proxy: Proxy, *, forgotten: bool = False) -> None: ...

    def drift(self, name: str, steps: list[PreviewStep]) -> None: ...

    def proxy_held(self, key: str, *, reason: str, message: str) -> None: ...

    def operation_started(self, plan: StackPlan, *, type_: str) -> None: ...

    def operation_finished(self, plan: StackPlan, *, type_: str, error: str | None = None) -> None: ...


@dataclass
class Reconciler:
    planner: Planner
    engine: Engine
    reporter: Reporter
    credentials: CredentialSource
    installation: str = "default"
    _applied: dict[str, str] = field(default_factory=dict)
    _outputs: StackOutputs = field(default_factory=StackOutputs)  # deflated: automation/stack_outputs.py
    _owned: dict[str, Ownership] = field(default_factory=dict)
    _refusals: dict[str, str] = field(default_factory=dict)  # stack -> why we leave it alone
    _drift_due: set[str] = field(default_factory=set)
    _refresh_due: set[str] = field(default_factory=set)  # drift checks that /proc may not answer
    _run_due: set[str] = field(default_factory=set)  # an `up` was asked for (reconcile-requested-at)
    _reporting: asyncio.Lock = field(default_factory=asyncio.Lock)  # a run with no `up`: its report
    updates: UpdateLog = field(default_factory=UpdateLog)  # each stack's last up or destroy

    async def __call__(self, name: str) -> None:
        await self.load_stack(name)
        plan = self.planner.plan(name)
        if plan.forget:
            await self._forget(plan)
            plan = self.planner.plan(name)  # what is left once the forgotten proxies are released
        if not plan.referenced:
            await self._destroy(name)
            return
        if plan.entry is None:
            raise self._provider_missing(plan)
        resolved = self._resolve(plan)
        due = name in self._drift_due
        # A local stack's check may be answered from /proc (not a repair's): automation/local_drift.py
        from_proc = due and name not in self._refresh_due and self._is_local(name)
        forced = name in self._run_due
        changed = forced or resolved.input.spec_hash != self._applied.get(name)
        correct = plan.entry.drift_policy == "correct"
        if from_proc and (correct or not changed):
            due = not await self._answered_from_proc(name)  # `correct`: a change's `up` needs no refresh
        drift_correct = due and correct
        detect = due and not drift_correct
        if changed or drift_correct:
            await self._up(plan, resolved, refresh=drift_correct or forced)
            # After the `up`, not before: a real change does not wait for the check (issue 20), and what
            # the check finds missing is not reported Provisioned again by the `up`'s report. The
            # processes checked are those the `up` recorded (a stack's first `up` records them all).
            if detect and not (from_proc and await self._answered_from_proc(name)):
                await self._detect_drift(name)
        else:
            held = set(resolved.held)
            del resolved  # its input (every proxy of the stack as JSON) is not held through the report
            missing = await self._detect_drift(name) if detect else set()
            async with self._reporting:  # one stack's report at a time: the resync's reports, 4 at once,
                # held 4 stacks' outputs and transients and raised the RSS for good (bench_leader_state)
                outputs = await asyncio.to_thread(self._outputs.get, name, REPORTED_OUTPUTS)  # off the loop
                await self.reporter.stack_applied(
                    plan, outputs=outputs, result=None, missing=missing, held=held
                )
                del outputs
        if self._release(plan.deleting) and not self.planner.plan(name).referenced:
            await self._destroy(name)  # the last proxies just left: nothing may stay behind

    async def load_stack(self, name: str) -> list[Proxy]:
        """Check the stack is ours and read what it last applied into the planner (once per stack).
        Returns the applied proxies. Raises StackNotOwnedError for a stack we must not touch."""
        early: asyncio.Future[dict[str, Any]] | None = None
        if self._owned.get(name) in (None, Ownership.UNCLAIMED):  # unclaimed: our catalogue may name it now
            if name not in self._applied:
                # Read beside the ownership check, two CLI calls at once (a new term reads every stack
                # before it acts: issue 20); used only once the stack is known to be ours.
                early = asyncio.ensure_future(asyncio.to_thread(self.engine.plain_outputs, name))
            try:
                self._owned[name] = await self._claim(name)
            except BaseException:
                _unwanted(early)
                raise
        if name in self._refusals or name in self._applied or not self._exists(name):
            _unwanted(early)
        if name in self._refusals:
            raise StackNotOwnedError(self._refusals[name])
        if name in self._applied:
            return []
        if not self._exists(name):
            outputs: dict[str, Any] = {}
        elif early is not None:
            outputs = await early
        else:
            outputs = await asyncio.to_thread(self.engine.plain_outputs, name)
        unreadable = unreadable_applied(outputs.get(APPLIED_PROXIES_OUTPUT))
        if unreadable:
            # Planning without them would delete them: hold the whole stack until they read again.
            raise InvalidInputError(
                f"stack {name} runs proxies that the current rules cannot read ({'; '.join(unreadable)}): "
                "nothing in this stack is changed until their manifests are fixed",
                reason=Reason.INVALID_SPEC,
            )
        applied = applied_proxies(outputs.get(APPLIED_PROXIES_OUTPUT))
        self._outputs.put(name, outputs)
        self._applied[name] = str(outputs.get(HASH_OUTPUT) or "")
        self.planner.remember_applied(applied)
        if applied and self._is_local(name):
            # A local proxy is a process on this machine: after a restart of the machine it is gone
            # although the state says it runs. Check before claiming anything serves.
            self._drift_due.add(name)
        return applied

    def applied(self, name: str) -> list[Proxy]:
        """The proxies the stack's outputs say it runs (empty before `load_stack`)."""
        return applied_proxies(self._outputs.get(name).get(APPLIED_PROXIES_OUTPUT))

    def applied_outputs(self, name: str) -> dict[str, Any]:
        """The outputs of the stack's last successful `up` (empty before `load_stack`): a fresh copy."""
        return self._outputs.get(name)

    def output_names(self, name: str) -> tuple[str, ...]:
        """The names of the stack's last outputs, sorted (empty before `load_stack`)."""
        return self._outputs.names(name)

    def last_update(self, name: str) -> LastUpdate | None:
        """How the stack's last `up` or `destroy` went (None before the first since this process started)."""
        return self.updates.get(name)

    def drift_check_due(self, name: str) -> bool:
        return name in self._drift_due

    def request_drift_check(self, name: str, *, refresh: bool = False) -> None:
        """Mark a stack for a drift check on its next run (the resync timer submits it to the queue).
        `refresh`: always with Pulumi's refresh, even for a `local` stack whose processes all check out in
        /proc (the repair of a proxy that fails its probes: `automation/local_drift.py`)."""
        self._drift_due.add(name)
        if refresh:
            self._refresh_due.add(name)

    def run_due(self, name: str) -> bool:
        return name in self._run_due

    def request_run(self, name: str) -> None:
        """Run `up` (with a refresh) on the stack's next run even if its input did not change."""
        self._run_due.add(name)

    # --- steps ------------------------------------------------------------------------------------------

    async def _claim(self, name: str) -> Ownership:
        tags = await asyncio.to_thread(self.engine.stack_tags, name)
        verdict = ownership(
            tags, installation=self.installation, in_catalogue=self.planner.catalogue.get(name) is not None
        )
        if verdict is Ownership.ADOPT:
            await asyncio.to_thread(self.engine.set_owner, name, self.installation)
            log.warning(
                "adopted stack %s: it had no owner tag and this installation's catalogue names it; it is now "
                "tagged as owned by installation '%s'",
                name,
                self.installation,
                extra={"fields": {"stack": name}},
            )
        self._refusals.pop(name, None)
        if verdict in (Ownership.FOREIGN, Ownership.UNCLAIMED):
            self._refusals[name] = not_owned_message(name, tags, installation=self.installation)
            log.warning("%s", self._refusals[name], extra={"fields": {"stack": name}})
        return verdict

    def _exists(self, name: str) -> bool:
        return self._owned.get(name) is not Ownership.NEW

    def _is_local(self, name: str) -> bool:
        entry = self.planner.catalogue.get(name)
        return entry is not None and entry.type == "local"

    def _resolve(self, plan: StackPlan) -> ResolvedStack:
        applied_credentials = (
            self._outputs.get(plan.name, (CREDENTIALS_OUTPUT,)).get(CREDENTIALS_OUTPUT) or {}
        )
        resolved = resolve_stack(plan, self.credentials, applied_credentials=applied_credentials)
        for key, message in resolved.skipped.items():
            self.reporter.proxy_event(key, reason=Reason.CREDENTIALS_MISSING, message=message, warning=True)
        for key, message in resolved.held.items():
            self.reporter.proxy_held(key, reason=Reason.CREDENTIALS_MISSING, message=message)
        return resolved

    async def _answered_from_proc(self, name: str) -> bool:
        """A drift check of a `local` stack whose recorded processes all run and hold their ports is
        answered: no refresh (`automation/local_drift.py`). False when a process does not check out (then
        the refresh runs and reports)."""

        def kept(outputs: dict[str, Any]) -> tuple[list[str] | None, Any]:
            # under the lock of one decode at a time (automation/stack_outputs.py): the applied proxies,
            # most of the outputs, are dropped before /proc is read
            return local_drift.applied_keys(outputs), outputs.get(local_drift.PROXIES_OUTPUT)

        def check() -> tuple[str, str] | None:
            return local_drift.first_unverified(*self._outputs.read(name, kept))

        found = await asyncio.to_thread(check)
        fields = {"fields": {"stack": name}}
        if found is not None:
            key, why = found
            because = why if key == "-" else f"{key}: {why}"
            log.info("drift check of stack %s: a refresh, because %s", name, because, extra=fields)
            return False
        self._checked(name)
        log.info(
            "drift check of stack %s: every applied proxy's process runs and holds its port (no refresh)",
            name,
            extra=fields,
        )
        return True

    def _checked(self, name: str) -> None:
        self._drift_due.discard(name)
        self._refresh_due.discard(name)

    async def _detect_drift(self, name: str) -> set[str]:
        """Report drift (detect policy); returns the proxies with resources that differ or are gone."""
        self._checked(name)
        steps = await asyncio.to_thread(self.engine.detect_drift, name)
        self.reporter.drift(name, steps)
        return {step.proxy for step in steps if step.proxy}

    async def _forget(self, plan: StackPlan) -> None:
        """Skip-cleanup: drop the proxies' components from state, keep the real resources, release them."""
        keys = [proxy.key for proxy in plan.forget]
        forgotten = await asyncio.to_thread(self.engine.forget, plan.name, keys)
        for proxy in plan.forget:
            mine = forgotten.get(proxy.key, [])
            what = ", ".join(mine) if mine else "nothing (it was not in the stack's state)"
            self.reporter.proxy_event(
                proxy.key,
                reason=Reason.FORGOTTEN,
                message=f"skip-cleanup: forgot from stack {plan.name} without deleting: {what}",
            )
        self._applied[plan.name] = ""  # the state changed under the applied hash: the next `up` runs
        self._release(plan.forget, forgotten=True)

    async def _destroy(self, name: str) -> None:
        started = self.updates.start()
        try:
            result = await asyncio.to_thread(self.engine.destroy, name)
        except Exception as exc:
            self.updates.failed(name, kind="destroy", started_at=started, error=exc)
            raise
        self.updates.forget(name)  # the stack is gone, and its row with it
        self._applied.pop(name, None)
        self._outputs.pop(name)
        self._owned.pop(name, None)
        self._refusals.pop(name, None)
        if result is not None:
            log.info(
                "destroyed and removed stack %s: %s", name, result.changes, extra={"fields": {"stack": name}}
            )
        self.reporter.stack_removed(name)

    async def _up(self, plan: StackPlan, resolved: ResolvedStack, *, refresh: bool) -> None:
        self.reporter.operation_started(plan, type_="up")
        started = self.updates.start()
        try:
            result = await asyncio.to_thread(self.engine.up, resolved.input, refresh=refresh)
        except Exception as exc:
            self.updates.failed(plan.name, kind="up", started_at=started, error=exc)
            self.reporter.operation_finished(
                plan, type_="up", error=getattr(exc, "message", None) or str(exc)
            )
            raise
        self.updates.succeeded(plan.name, kind="up", started_at=started, result=result)
        self.reporter.operation_finished(plan, type_="up")
        self._owned[plan.name] = Ownership.OURS  # created (and tagged) by this up if it was new
        self._applied[plan.name] = resolved.input.spec_hash
        self._outputs.put(plan.name, result.outputs)
        self._checked(plan.name)
        self._run_due.discard(plan.name)
        self.planner.mark_applied(plan)
        await self.reporter.stack_applied(
            plan, outputs=result.outputs, result=result, held=set(resolved.held)
        )

    def _release(self, proxies: tuple[Proxy, ...], *, forgotten: bool = False) -> bool:
        """Release leaving proxies; one declared again meanwhile stays (its stack runs again). True when
        any was released."""
        released = False
        for proxy in proxies:
            if self.planner.release(proxy):
                released = True
                self.reporter.released(proxy, forgotten=forgotten)
        return released

    def _provider_missing(self, plan: StackPlan) -> UnknownProviderError:
        message = (
            f"provider '{plan.name}' is not in the catalogue: restore the entry so these proxies can be "
            f"provisioned or removed, or annotate a deleting proxy with crawl.example.com/skip-cleanup: "
            f'"true" to forget its resources'
        )
        for proxy in plan.deleting:
            self.reporter.proxy_event(
                proxy.key, reason=Reason.PROVIDER_MISSING, message=message, warning=True
            )
        for planned in plan.proxies:
            self.reporter.proxy_held(planned.key, reason=Reason.PROVIDER_MISSING, message=message)
        return UnknownProviderError(message)


def _unwanted(read: asyncio.Future[Any] | None) -> None:
    """A read started early whose answer is not wanted: its outcome (an error included) is dropped."""
    if read is not None:
        read.add_done_callback(lambda done: done.cancelled() or done.exception())
