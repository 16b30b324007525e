"""GitOps preview: which stacks a set of manifests would change, and what `up`/`destroy` would do to them.

A stack is previewed when its final hash (`resolve_stack(...).input.spec_hash`, the one the reconciler
compares) differs from the hash its last `up` applied, or always with `all_stacks`. The decisions are the
control loop's: what a stack applied is read first; a proxy the manifests no longer name is deleted only
after a complete read (else held); an invalid or unresolvable one is held at its applied version; a large
removal is flagged as the deletion budget would stop it. A stack whose proxies all leave is previewed as a
destroy. A preview
writes nothing to the backend, so CI can run it with read-only credentials: a stack that does not exist yet
(a new catalogue entry) is previewed against a throwaway backend (`Engine.preview_new`), since the
Automation API can only preview a stack it has selected, and selecting a missing stack creates it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from automation.deletion_budget import DeletionBudget, assess
from automation.engine import (
    APPLIED_PROXIES_OUTPUT,
    CREDENTIALS_OUTPUT,
    HASH_OUTPUT,
    Engine,
    PreviewStep,
    StackInput,
)
from automation.errors import ProxyOperatorError
from automation.ownership import Ownership, not_owned_message, ownership
from automation.planner import Planner, StackPlan
from automation.preview_model import Decisions, PreviewReport, StackPreview, StepModel, proxy_changes
from automation.stack_input import CredentialSource, applied_proxies, resolve_stack
from stacks.models import ProviderCatalogue, Proxy

log = logging.getLogger(__name__)

Operation = Literal["up", "destroy", "none"]


@dataclass(frozen=True)
class DesiredState:
    """What the manifests declare: the catalogue, the Proxies, where Secret-backed credentials come from,
    whether the read was complete (only then does absence declare a deletion), and what the read held."""

    catalogue: ProviderCatalogue
    proxies: Sequence[Proxy]
    credentials: CredentialSource
    complete: bool = True
    held: Mapping[str, str] = field(default_factory=dict)  # key -> why its declared version is not used


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
    problems: list[str]  # proxies refused with nothing applied to fall back on
    decisions: Decisions = field(default_factory=lambda: Decisions())


@dataclass
class _Backend:
    """What the backend's stacks hold, read once: outputs of ours, the reason each foreign one is left."""

    existing: set[str]
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    foreign: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # stacks whose state could not be read


def applied_in_backend(engine: Engine) -> list[Proxy]:
    """Every proxy the backend's stacks say they applied (a stack that cannot be read is left out: the
    preview reports it on that stack)."""
    applied: list[Proxy] = []
    for name in sorted(engine.list_stack_names()):
        try:
            applied += applied_proxies(engine.plain_outputs(name).get(APPLIED_PROXIES_OUTPUT))
        except ProxyOperatorError:
            continue
    return applied


def plan_previews(
    engine: Engine,
    desired: DesiredState,
    *,
    installation: str | None = None,
    budget: DeletionBudget | None = None,
) -> PreviewPlan:
    """Every stack the manifests or the backend know, with what applying the manifests would run on it,
    judged as the control loop judges: applied proxies first, then the declared ones; absence deletes only
    after a complete read; an invalid or unresolvable proxy is held at its applied version. With
    `installation`, stacks another installation owns are left out (and listed)."""
    planner = Planner()
    planner.set_catalogue(desired.catalogue)
    backend = _read_backend(engine, planner, installation=installation)
    applied = planner.applied_keys()
    for proxy in desired.proxies:
        planner.upsert(proxy)
    decisions = Decisions(foreign=dict(backend.foreign))
    absent = sorted(applied - {p.key for p in desired.proxies} - set(desired.held))
    _judge_absent(planner, desired, absent, decisions)
    _judge_held(planner, desired, decisions)
    _judge_budget(planner, decisions, budget=budget or DeletionBudget())
    targets = []
    for name in sorted((planner.stacks() | backend.existing) - set(backend.foreign)):
        plan = planner.plan(name)
        if name in backend.errors:
            targets.append(PreviewTarget(name=name, operation="up", existed=True, error=backend.errors[name]))
            continue
        try:
            target = _target(plan, backend=backend, credentials=desired.credentials, decisions=decisions)
        except ProxyOperatorError as exc:  # e.g. a provider Secret is missing: report, go on
            target = PreviewTarget(
                name=name, operation="up", existed=name in backend.existing, error=_text(exc)
            )
        if target is not None:
            targets.append(target)
    problems = [f"{key}: {message}" for key, message in sorted(decisions.refused.items())]
    return PreviewPlan(targets=targets, problems=problems, decisions=decisions)


def _read_backend(engine: Engine, planner: Planner, *, installation: str | None) -> _Backend:
    backend = _Backend(existing=set(engine.list_stack_names()))
    for name in sorted(backend.existing):
        if installation is not None:
            tags = engine.stack_tags(name)
            verdict = ownership(
                tags, installation=installation, in_catalogue=planner.catalogue.get(name) is not None
            )
            if verdict in (Ownership.FOREIGN, Ownership.UNCLAIMED):
                backend.foreign[name] = not_owned_message(name, tags, installation=installation)
                continue
        try:
            outputs = engine.plain_outputs(name)
        except ProxyOperatorError as exc:  # e.g. the state cannot be decrypted: report it on the stack
            backend.errors[name] = _text(exc)
            continue
        backend.outputs[name] = outputs
        planner.remember_applied(applied_proxies(outputs.get(APPLIED_PROXIES_OUTPUT)))
    return backend


def _judge_absent(planner: Planner, desired: DesiredState, absent: list[str], decisions: Decisions) -> None:
    """Applied proxies the manifests do not name: deleted after a complete read, held otherwise."""
    for key in absent:
        proxy = planner.current(key)
        if proxy is None:
            continue
        if desired.complete:
            leaving = proxy.model_copy(deep=True)
            leaving.metadata.deletion_timestamp = datetime.now(UTC)
            planner.upsert(leaving)
            decisions.deleted.append(key)
        else:
            decisions.held[key] = (
                "not found in the manifests, but they were not read completely: absence is not a deletion "
                "until they read cleanly; its applied version stays"
            )


def _judge_held(planner: Planner, desired: DesiredState, decisions: Decisions) -> None:
    for key, why in desired.held.items():
        if planner.is_applied(key):
            decisions.held.setdefault(key, f"{why}; its applied version stays")
        else:
            decisions.refused[key] = why  # nothing of it runs: it is left out
    for key, error in sorted(planner.rejected.items()):
        if planner.held_version(key) is not None:
            decisions.held.setdefault(key, f"{error.reason}: {error.message}; its applied version stays")
        else:
            decisions.refused[key] = f"{error.reason}: {error.message}"


def _judge_budget(planner: Planner, decisions: Decisions, *, budget: DeletionBudget) -> None:
    held = assess(
        decisions.deleted,
        fleet=planner.applied_count() + len(decisions.deleted),
        budget=budget,
        allowed=set(),
    )
    if held is not None:
        decisions.deletion_budget = held.message(budget=budget)


def _target(
    plan: StackPlan, *, backend: _Backend, credentials: CredentialSource, decisions: Decisions
) -> PreviewTarget | None:
    existed = plan.name in backend.existing
    if not plan.proxies:
        # Nobody names this provider any more: the reconciler would destroy the stack (if there is one).
        return PreviewTarget(name=plan.name, operation="destroy", existed=True) if existed else None
    if plan.entry is None:
        message = f"provider '{plan.name}' is not in the catalogue: add the entry or move the proxies"
        return PreviewTarget(name=plan.name, operation="up", existed=existed, error=message)
    outputs = backend.outputs.get(plan.name, {})
    resolved = resolve_stack(plan, credentials, applied_credentials=outputs.get(CREDENTIALS_OUTPUT) or {})
    for key, why in resolved.held.items():
        decisions.held.setdefault(key, why)
    applied = str(outputs.get(HASH_OUTPUT) or "") or None
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
    return PreviewReport(
        all_stacks=all_stacks, stacks=stacks, problems=plan.problems, decisions=plan.decisions
    )


def preview(
    engine: Engine,
    desired: DesiredState,
    *,
    all_stacks: bool = False,
    installation: str | None = None,
    budget: DeletionBudget | None = None,
) -> PreviewReport:
    plan = plan_previews(engine, desired, installation=installation, budget=budget)
    return run_previews(engine, plan, all_stacks=all_stacks)


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
