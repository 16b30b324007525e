"""Engine events into structured logs, each line naming the stack and, where it applies, the proxy."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the SDK is imported by the engine's first operation (core.py)
    from pulumi.automation import events as ev

log = logging.getLogger("automation.engine.events")

UNCHANGING = frozenset({"same", "read", "refresh"})  # step ops that change no resource

COMPONENT_TYPE = "proxy-operator:index:Proxy"


def urn_name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def urn_type(urn: str) -> str:
    return urn.split("::")[2].rsplit("$", 1)[-1] if urn.count("::") >= 3 else ""


@dataclass
class EventLogger:
    """Callable given to `on_event`: logs each step, and keeps the events for the caller when `keep` (a
    preview reads its steps from them). An `up` keeps none: each event carries a resource's whole state,
    an `up` of 500 shared proxies sends about 3,000, and keeping them held tens of MiB per run in the
    service (the 10,000-running-proxies bench, operations.md)."""

    stack: str
    operation: str
    keep: bool | Callable[[ev.EngineEvent], bool] = False  # every event, or those the predicate takes
    events: list[ev.EngineEvent] = field(default_factory=list)
    # urn -> its parent's, from every step seen (kept or not), recorded only where a predicate keeps some
    # events (a drift check): their proxies are found through it once the operation ended (a refresh
    # announces children and parents in any order, so the proxy cannot be known at each step). An `up`
    # or a `destroy` keeps none and records none.
    parents: dict[str, str | None] = field(default_factory=dict)
    _proxy_of: dict[str, str] = field(default_factory=dict)

    def __call__(self, event: ev.EngineEvent) -> None:
        if self.keep is True or (callable(self.keep) and self.keep(event)):
            self.events.append(event)
        if callable(self.keep):
            for step in (event.resource_pre_event, event.res_outputs_event):
                if step is not None:
                    state = step.metadata.new or step.metadata.old
                    self.parents[step.metadata.urn] = state.parent if state is not None else None
        if event.resource_pre_event is not None:
            self._step(event.resource_pre_event.metadata)
        elif event.res_op_failed_event is not None:
            meta = event.res_op_failed_event.metadata
            self._log(logging.WARNING, "step failed", urn=meta.urn, op=str(meta.op.value))
        elif event.diagnostic_event is not None:
            self._diagnostic(event.diagnostic_event)
        elif event.summary_event is not None:
            changes = {
                str(op.value if hasattr(op, "value") else op): n
                for op, n in (event.summary_event.resource_changes or {}).items()
            }
            self._log(logging.INFO, "summary", changes=changes)

    def proxy_for(self, urn: str | None) -> str | None:
        return self._proxy_of.get(urn or "")

    def _step(self, meta: ev.StepEventMetadata) -> None:
        state = meta.new or meta.old
        parent = state.parent if state is not None else None
        if urn_type(meta.urn) == COMPONENT_TYPE:
            self._proxy_of[meta.urn] = urn_name(meta.urn)
        elif parent in self._proxy_of:
            self._proxy_of[meta.urn] = self._proxy_of[parent]
        # Steps that change nothing at DEBUG: a drift check of a 500-proxy stack announces 1,500 refreshes.
        level = logging.DEBUG if str(meta.op.value) in UNCHANGING else logging.INFO
        self._log(level, "step", urn=meta.urn, op=str(meta.op.value))

    def _diagnostic(self, diag: ev.DiagnosticEvent) -> None:
        if diag.ephemeral or diag.severity in ("debug", "info#err") or not diag.message.strip():
            return
        level = logging.ERROR if diag.severity == "error" else logging.INFO
        self._log(level, diag.message.strip()[:1000], urn=diag.urn)

    def _log(self, level: int, message: str, *, urn: str | None = None, **fields: object) -> None:
        extra = {"stack": self.stack, "operation": self.operation, "proxy": self.proxy_for(urn), **fields}
        if urn:
            extra["urn"] = urn
        log.log(level, "%s %s %s", self.operation, self.stack, message, extra={"fields": extra})
