"""Plain results of engine operations, free of Pulumi types so that callers need not import them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from automation.engine.config import HASH_OUTPUT
from automation.engine.events import COMPONENT_TYPE, urn_name, urn_type

if TYPE_CHECKING:  # annotations only: a follower imports this module and never the SDK
    from pulumi.automation import events as ev

CHANGE_OPS = ("create", "update", "replace", "delete")


@dataclass(frozen=True)
class OperationResult:
    stack: str
    kind: str
    result: str
    changes: dict[str, int]
    outputs: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_summary(
        cls, *, stack: str, kind: str, summary: Any, outputs: dict[str, Any] | None = None
    ) -> OperationResult:
        return cls(
            stack=stack,
            kind=kind,
            result=str(summary.result),
            changes=dict(summary.resource_changes or {}),
            outputs=outputs or {},
        )

    @property
    def changed(self) -> bool:
        return any(self.changes.get(op, 0) for op in CHANGE_OPS)


@dataclass(frozen=True)
class PreviewStep:
    """One step of a preview: `op` is create, update, replace, delete, same, read, refresh..."""

    op: str
    urn: str
    type: str
    name: str
    proxy: str | None
    diffs: tuple[str, ...] = ()


def steps_from_events(
    events: list[ev.EngineEvent],
    *,
    outcomes: bool = False,
    parents: Mapping[str, str | None] | None = None,
) -> list[PreviewStep]:
    """Steps as announced before they run; with `outcomes`, as they turned out (a refresh step is
    announced as `refresh` and ends as `same`, `update` or `delete`). `parents` (urn -> its parent's,
    `EventLogger.parents`) where `events` do not hold every step: each step's proxy is found through them."""
    if outcomes:
        metas = [e.res_outputs_event.metadata for e in events if e.res_outputs_event is not None]
    else:
        metas = [e.resource_pre_event.metadata for e in events if e.resource_pre_event is not None]
    # Parents first, in a second pass: a delete lists children before their parent component.
    parents = {**(parents or {}), **{meta.urn: _parent(meta) for meta in metas}}
    return [
        PreviewStep(
            op=_op_name(meta.op),
            urn=meta.urn,
            type=meta.type,
            name=urn_name(meta.urn),
            proxy=_proxy_of(meta.urn, parents),
            diffs=tuple(meta.diffs or meta.keys or ()),  # keys: what forces a replacement
        )
        for meta in metas
    ]


def _parent(meta: ev.StepEventMetadata) -> str | None:
    state = meta.new or meta.old
    return state.parent if state is not None else None


def _proxy_of(urn: str | None, parents: dict[str, str | None]) -> str | None:
    """The key of the proxy component at or above `urn`, if any."""
    seen: set[str] = set()
    while urn and urn not in seen:
        if urn_type(urn) == COMPONENT_TYPE:
            return urn_name(urn)
        seen.add(urn)
        urn = parents.get(urn)
    return None


def _op_name(op: ev.OpType) -> str:
    # create-replacement / delete-replaced / replace all read as one "replace" to a human.
    value = str(op.value)
    return "replace" if "replace" in value else value


@dataclass(frozen=True)
class StackInfo:
    name: str
    resource_count: int
    proxies: list[str]
    applied_hash: str | None
    last_operation: str | None
    last_result: str | None
    last_started: datetime | None
    last_finished: datetime | None
    outputs: dict[str, tuple[Any, bool]] = field(repr=False)
    last_changes: dict[str, int] = field(default_factory=dict)  # the last update's resource counts

    @classmethod
    def build(
        cls, *, name: str, deployment: dict[str, Any], outputs: dict[str, Any], history: list[Any]
    ) -> StackInfo:
        resources = deployment.get("resources") or []
        proxies = sorted(urn_name(r["urn"]) for r in resources if r.get("type") == COMPONENT_TYPE)
        last = history[0] if history else None
        hash_output = outputs.get(HASH_OUTPUT)
        return cls(
            name=name,
            resource_count=len([r for r in resources if not r.get("type", "").startswith("pulumi:")]),
            proxies=proxies,
            applied_hash=str(hash_output.value) if hash_output else None,
            last_operation=getattr(last, "kind", None),
            last_result=getattr(last, "result", None),
            last_started=getattr(last, "start_time", None),
            last_finished=getattr(last, "end_time", None),
            outputs={key: (out.value, out.secret) for key, out in outputs.items()},
            last_changes=dict(getattr(last, "resource_changes", None) or {}),
        )
