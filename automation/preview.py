"""GitOps preview: which stacks a set of manifests would change, and what `up`/`destroy` would do to them.

A stack is previewed when its final hash (`resolve_stack(...).input.spec_hash`, the one the reconciler
compares) differs from the hash its last `up` applied, or always with `all_stacks`. A stack that exists in
the backend but that no manifest names any more would be destroyed: it is previewed as a destroy. A preview
writes nothing to the backend, so CI can run it with read-only credentials: a stack that does not exist yet
(a new catalogue entry) is previewed against a throwaway backend (`Engine.preview_new`), since the
Automation API can only preview a stack it has selected, and selecting a missing stack creates it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from automation.engine import Engine, PreviewStep, StackInput
from automation.errors import ProxyOperatorError
from automation.planner import Planner, StackPlan
from automation.preview_model import PreviewReport, StackPreview, StepModel, proxy_changes
from automation.stack_input import CredentialSource, resolve_stack
from stacks.models import ProviderCatalogue, Proxy

log = logging.getLogger(__name__)

Operation = Literal["up", "destroy", "none"]


@dataclass(frozen=True)
class DesiredState:
    """What the manifests declare: the catalogue, the Proxies, where Secret-backed credentials come from."""

    catalogue: ProviderCatalogue
    proxies: Sequence[Proxy]
    credentials: CredentialSource


@dataclass(frozen=True)
class PreviewTarget:
    """One stack's place in a preview, decided before any preview runs."""

    name: str
    operation: Operation
    existed: bool
    input: StackInput | None = None
    applied_hash: str | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    @property
    def desired_hash(self) -> str | None:
        return self.input.spec_hash if self.input is not None else None


@dataclass(frozen=True)
class PreviewPlan:
    targets: list[PreviewTarget]
    problems: list[str]  # proxies the planner rejected (validation normally stops these earlier)


def plan_previews(engine: Engine, desired: DesiredState) -> PreviewPlan:
    """Every stack the manifests or the backend know, with what applying the manifests would run on it."""
    planner = Planner()
    planner.set_catalogue(desired.catalogue)
    for proxy in desired.proxies:
        planner.upsert(proxy)
    existing = set(engine.list_stack_names())
    targets = []
    for name in sorted(planner.stacks() | existing):
        plan = planner.plan(name)
        try:
            target = _target(plan, engine=engine, existing=existing, credentials=desired.credentials)
        except ProxyOperatorError as exc:  # e.g. the applied hash cannot be read: report, go on
            target = PreviewTarget(name=name, operation="up", existed=name in existing, error=_text(exc))
        if target is not None:
            targets.append(target)
    problems = [f"{key}: {error.message}" for key, error in sorted(planner.rejected.items())]
    return PreviewPlan(targets=targets, problems=problems)


def _target(
    plan: StackPlan, *, engine: Engine, existing: set[str], credentials: CredentialSource
) -> PreviewTarget | None:
    existed = plan.name in existing
    if not plan.proxies:
        # Nobody names this provider: the reconciler would destroy the stack (if there is one).
        return PreviewTarget(name=plan.name, operation="destroy", existed=True) if existed else None
    if plan.entry is None:
        message = f"provider '{plan.name}' is not in the catalogue: add the entry or move the proxies"
        return PreviewTarget(name=plan.name, operation="up", existed=existed, error=message)
    resolved = resolve_stack(plan, credentials)
    applied = engine.applied_hash(plan.name) if existed else None
    operation: Operation = "none" if resolved.input.spec_hash == applied else "up"
    return PreviewTarget(
        name=plan.name,
        operation=operation,
        existed=existed,
        input=resolved.input,
        applied_hash=applied,
        skipped=dict(resolved.skipped),
    )


def run_previews(engine: Engine, plan: PreviewPlan, *, all_stacks: bool = False) -> PreviewReport:
    """Preview each target that would change (every one with `all_stacks`); a failure never stops the rest."""
    stacks = [_run(engine, target, force=all_stacks) for target in plan.targets]
    return PreviewReport(all_stacks=all_stacks, stacks=stacks, problems=plan.problems)


def preview(engine: Engine, desired: DesiredState, *, all_stacks: bool = False) -> PreviewReport:
    return run_previews(engine, plan_previews(engine, desired), all_stacks=all_stacks)


def _run(engine: Engine, target: PreviewTarget, *, force: bool) -> StackPreview:
    wanted = target.error is None and (force or target.operation != "none")
    steps: list[PreviewStep] = []
    error = target.error
    if wanted:
        try:
            steps = _steps(engine, target)
        except ProxyOperatorError as exc:
            error = _text(exc)
            log.warning("preview of stack %s failed: %s", target.name, error)
    changing = _changing(steps)
    return StackPreview(
        name=target.name,
        operation=target.operation,
        previewed=wanted and error is None,
        applied_hash=target.applied_hash,
        desired_hash=target.desired_hash,
        proxies=proxy_changes(changing),
        steps=[StepModel.of(step) for step in changing],
        skipped=target.skipped,
        error=error,
    )


def _steps(engine: Engine, target: PreviewTarget) -> list[PreviewStep]:
    if target.operation == "destroy":
        return engine.preview_destroy(target.name)
    assert target.input is not None
    if not target.existed:
        return engine.preview_new(target.input)  # no state to read; nothing may be written to the backend
    return engine.preview(target.input)


def _changing(steps: list[PreviewStep]) -> list[PreviewStep]:
    """Steps that change something, one per resource and op (a replacement arrives as three events)."""
    kept: dict[tuple[str, str], PreviewStep] = {}
    for step in steps:
        if step.op in ("same", "read"):
            continue
        earlier = kept.get((step.urn, step.op))
        if earlier is None or (step.diffs and not earlier.diffs):
            kept[(step.urn, step.op)] = step  # the event that names the fields forcing a replacement
    return list(kept.values())


def _text(exc: ProxyOperatorError) -> str:
    return f"{exc.reason}: {exc.message}"
