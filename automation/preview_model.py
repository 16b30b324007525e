"""The preview report: what applying a set of manifests would do, per stack and per proxy.

`proxy-operator preview --json` prints `PreviewReport` (camelCase keys; `PreviewReport.model_json_schema()`
is the formal schema). Schema version 1:

    {"schemaVersion": 1, "allStacks": false, "ok": true, "problems": [],
     "totals": {"stacks": 1, "changedStacks": 1, "failedStacks": 0,
                "create": 1, "update": 0, "replace": 1, "delete": 0},
     "stacks": [{"name": "local", "operation": "up", "previewed": true, "changed": true,
                 "appliedHash": "3a29...", "desiredHash": "91bc...",
                 "proxies": {"create": ["crawl/c"], "update": [], "replace": ["crawl/b"], "delete": []},
                 "resourceChanges": {"create": 3, "replace": 1},
                 "steps": [{"op": "create", "urn": "urn:pulumi:...", "type": "...", "name": "crawl/c",
                            "proxy": "crawl/c", "diffs": []}],
                 "skipped": {}, "error": null}]}

`operation` is what applying would run on the stack: `up`, `destroy` (no manifest names the provider any
more), or `none` (the applied hash matches; not previewed unless asked for all). `proxies` lists proxy keys
by what happens to them: `create`/`delete` when the proxy's component comes or goes, `replace` when one of
its resources is replaced, `update` for any other change. `steps` holds every step that changes something.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field
from pydantic.alias_generators import to_camel

from automation.engine import PreviewStep
from automation.engine.events import COMPONENT_TYPE

PROXY_OPS = ("create", "update", "replace", "delete")


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class StepModel(_Wire):
    op: str
    urn: str
    type: str
    name: str
    proxy: str | None = None
    diffs: list[str] = Field(default_factory=list)

    @classmethod
    def of(cls, step: PreviewStep) -> StepModel:
        return cls(
            op=step.op, urn=step.urn, type=step.type, name=step.name, proxy=step.proxy, diffs=list(step.diffs)
        )


class ProxyChanges(_Wire):
    create: list[str] = Field(default_factory=list)
    update: list[str] = Field(default_factory=list)
    replace: list[str] = Field(default_factory=list)
    delete: list[str] = Field(default_factory=list)

    def count(self, op: str) -> int:
        return len(getattr(self, op))

    @property
    def any(self) -> bool:
        return any(self.count(op) for op in PROXY_OPS)


def proxy_changes(steps: Iterable[PreviewStep]) -> ProxyChanges:
    """Per proxy, one verdict: its component's create/delete wins, then a replaced child, then update."""
    component: dict[str, str] = {}
    children: dict[str, set[str]] = defaultdict(set)
    for step in steps:
        if step.proxy is None or step.op in ("same", "read"):
            continue
        if step.type == COMPONENT_TYPE:
            component[step.proxy] = step.op
        else:
            children[step.proxy].add(step.op)
    verdicts: dict[str, list[str]] = {op: [] for op in PROXY_OPS}
    for key in sorted(component.keys() | children.keys()):
        op = component.get(key, "")
        if op not in ("create", "delete"):
            op = "replace" if "replace" in children[key] else "update"
        verdicts[op].append(key)
    return ProxyChanges(**verdicts)


class StackPreview(_Wire):
    name: str
    operation: Literal["up", "destroy", "none"]
    previewed: bool
    applied_hash: str | None = None
    desired_hash: str | None = None
    proxies: ProxyChanges = Field(default_factory=ProxyChanges)
    steps: list[StepModel] = Field(default_factory=list)
    skipped: dict[str, str] = Field(default_factory=dict)  # proxy key -> why it was left out
    error: str | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def resource_changes(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for step in self.steps:
            counts[step.op] += 1
        return dict(sorted(counts.items()))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def changed(self) -> bool:
        return bool(self.steps)


class Totals(_Wire):
    stacks: int
    changed_stacks: int
    failed_stacks: int
    create: int
    update: int
    replace: int
    delete: int


class Decisions(_Wire):
    """What the control loop would decide about proxies, beside the resource changes (filled in while
    the preview is planned, so not frozen)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=False)

    held: dict[str, str] = Field(default_factory=dict)  # key -> why its applied version stays
    refused: dict[str, str] = Field(default_factory=dict)  # key -> why it is left out (nothing applied)
    deleted: list[str] = Field(default_factory=list)  # declared deletions (removed from a complete read)
    foreign: dict[str, str] = Field(default_factory=dict)  # stack -> why it is left alone
    deletion_budget: str | None = None  # set when the deletion budget would stop this change


class PoolChild(_Wire):
    name: str
    placement: str
    change: Literal["create", "keep", "delete"]  # a created child's name is drawn again at apply


class PoolPreview(_Wire):
    """A ProxyPool's expansion: the children applying the manifests would leave, create and delete."""

    pool: str  # ns/name
    desired: int
    children: list[PoolChild] = Field(default_factory=list)

    def count(self, change: str) -> int:
        return sum(1 for child in self.children if child.change == change)


class PreviewReport(_Wire):
    schema_version: Literal[1] = 1
    all_stacks: bool = False
    stacks: list[StackPreview] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)
    decisions: Decisions = Field(default_factory=Decisions)
    pools: list[PoolPreview] = Field(default_factory=list)  # set by the caller that expands the pools

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        """False on a problem, a failed preview, a held proxy or a removal the budget would stop."""
        return not (
            self.problems
            or any(stack.error for stack in self.stacks)
            or self.decisions.held
            or self.decisions.deletion_budget
        )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def totals(self) -> Totals:
        per_op = {op: sum(stack.proxies.count(op) for stack in self.stacks) for op in PROXY_OPS}
        return Totals(
            stacks=len(self.stacks),
            changed_stacks=sum(1 for stack in self.stacks if stack.changed),
            failed_stacks=sum(1 for stack in self.stacks if stack.error),
            **per_op,
        )

    def stack(self, name: str) -> StackPreview:
        return next(stack for stack in self.stacks if stack.name == name)
