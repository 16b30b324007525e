"""What the page reads from the control loop; imported by serve only (the settings import
`service.ui.settings`, and must not import the loop through this package).

The stacks view's rows: the queue's states, the reconciler's last update of each stack (kind, result,
when, how long, resource counts), the lock (a run of this replica, or the holder a StackLocked failure
names) and the names of the outputs of each stack's last `up`, no Pulumi CLI call. The pools view's
statuses: the pool source's (directory mode) or the leader's ProxyPool watch (in a cluster). The held
deletion: the deletion gate's. A follower has no loop: it shows what the leader published for it
(`summary_content`, service/kube/summary.py), and says whose and how old.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from automation.errors import StackLockedError
from automation.last_update import LastUpdate
from automation.queue_state import QueueState, StackQueueState
from service.controller import Controller
from service.incluster import ClusterMode
from service.kube.summary import PublishedSummary
from service.pools.history import PoolDecision
from service.pools.source import PoolSource
from service.ui.context import DesiredHash, Forgotten, HeldSource, HeldView, StackRow, StacksSource
from service.ui.html import ago
from service.ui.pools import PoolsSource
from stacks.models import Proxy, ProxyPoolStatus
from stacks.spec_hash import proxy_spec_hash

Control = Controller | ClusterMode


def _following(control: Control) -> tuple[bool, PublishedSummary | None]:
    """(whether this replica follows, the leader's summary if it does and there is one)."""
    if isinstance(control, ClusterMode) and not control.leading:
        return True, control.summary_reader.read()
    return False, None


def stack_rows(control: Control, *, owner: str) -> StacksSource:
    """`owner`: this installation's name, which every stack it manages is tagged with."""

    def rows() -> Sequence[StackRow]:
        following, summary = _following(control)
        if following:
            return [_stack_row(s) for s in summary.stacks] if summary else []
        return _own_stack_rows(control, owner=owner)

    return rows


def _own_stack_rows(control: Control, *, owner: str) -> list[StackRow]:
    loop = control.controller if isinstance(control, ClusterMode) else control
    if loop is None:
        return []
    found = []
    for name, state in sorted(loop.queue.states().items()):
        error = state.last_error
        row = StackRow(
            name=name,
            owner=owner,
            state=state.state.value,
            runs=state.runs,
            consecutive_failures=state.consecutive_failures,
            reason=state.reason,
            error=str(error) if error else None,
            next_retry_at=_wall(state.next_retry_at),  # whole seconds: a summary unchanged between polls
            outputs=loop.reconciler.output_names(name),
            lock=lock_of(state),
        )
        found.append(with_last_update(row, loop.reconciler.last_update(name)))
    return found


RUNNING_HERE = "held by this replica (running)"
RUNNING_ON_LEADER = "held by the leader (running)"  # the same, as a follower shows the leader's row


def lock_of(state: StackQueueState) -> str | None:
    """Who holds the stack's lock as far as this replica knows: its own run, or the holder that the last
    failure (StackLocked) names."""
    if state.state is QueueState.RUNNING:
        return RUNNING_HERE
    error = state.last_error
    if isinstance(error, StackLockedError):
        return "held by " + (", ".join(error.holders) or "another operation (the CLI named no holder)")
    return None


def with_last_update(row: StackRow, last: LastUpdate | None) -> StackRow:
    if last is None:
        return row
    return dataclasses.replace(
        row,
        last_kind=last.kind,
        last_result=last.result,
        last_reason=last.reason,
        last_started_at=last.started_at,
        last_seconds=last.seconds,
        last_changes=last.counts,
    )


def _stack_row(raw: Mapping[str, Any]) -> StackRow:
    """A row the leader published: its known fields (a newer leader's extra ones are left out)."""
    names = {f.name for f in dataclasses.fields(StackRow)}
    values = {k: v for k, v in raw.items() if k in names}
    for listed in ("outputs", "last_changes"):  # tuples travel as JSON lists
        if isinstance(values.get(listed), list):
            values[listed] = tuple(str(o) for o in values[listed])
    if values.get("lock") == RUNNING_HERE:
        values["lock"] = RUNNING_ON_LEADER
    try:
        return StackRow(**values)
    except TypeError:  # a field it lacks: show the name and say so
        name = str(raw.get("name") or "?")
        return StackRow(name=name, owner="", state="unknown", reason="SummaryUnreadable")


def _wall(monotonic: float | None) -> float | None:
    """The queue's retry time is on the monotonic clock; the page shows wall time."""
    return None if monotonic is None else round(time.time() + (monotonic - time.monotonic()))


def desired_hashes(control: Control) -> DesiredHash:
    """Each proxy's spec hash as the planner holds it now (a dict look-up, nothing decoded). A follower
    has no planner: it hashes the watched object's spec as the leader's source would emit it (a decode per
    shown row)."""

    def desired(key: str) -> str | None:
        if isinstance(control, ClusterMode) and not control.leading:
            obj = control.source.object(key)
            if obj is None or obj.deleting:
                return None
            with contextlib.suppress(ValidationError):
                return proxy_spec_hash(Proxy.model_validate(obj.body))
            return None
        loop = control.controller if isinstance(control, ClusterMode) else control
        return loop.planner.spec_hash_of(key) if loop is not None else None

    return desired


def pool_statuses(control: Control) -> PoolsSource | None:
    if isinstance(control, Controller):
        if isinstance(control.source, PoolSource):
            source = control.source
            return lambda: dict(source.status)
        return None

    def statuses() -> Mapping[str, ProxyPoolStatus]:
        following, summary = _following(control)
        if following:
            found = {}
            for key, raw in (summary.pools if summary else {}).items():
                try:
                    found[key] = ProxyPoolStatus.model_validate(raw)
                except ValidationError:
                    continue
            return found
        return control.pools.statuses() if control.pools is not None else {}

    return statuses


def pool_decisions(control: Control) -> Callable[[], Sequence[PoolDecision]] | None:
    """The pools' last decisions: the pool source's (directory mode), the leader's ClusterPools', or on a
    follower as the leader published them."""
    if isinstance(control, Controller):
        source = control.source
        return (lambda: source.history.recent()) if isinstance(source, PoolSource) else None

    def decisions() -> Sequence[PoolDecision]:
        following, summary = _following(control)
        if following:
            found = []
            for raw in summary.pool_decisions if summary else []:
                with contextlib.suppress(TypeError, ValueError):
                    found.append(
                        PoolDecision(at=float(raw["at"]), pool=str(raw["pool"]), message=str(raw["message"]))
                    )
            return found
        return control.pool_history.recent()

    return decisions


def forgotten(control: Control) -> Callable[[], Sequence[Forgotten]]:
    """What skip-cleanup forgot (the `Forgotten` events this replica's loop recorded, the last 50), or on
    a follower as the leader published them."""

    def found() -> Sequence[Forgotten]:
        following, summary = _following(control)
        if following:
            out = []
            for raw in summary.forgotten if summary else []:
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    out.append(
                        Forgotten(key=str(raw["key"]), message=str(raw["message"]), at=float(raw["at"]))
                    )
            return out
        events = [e for e in control.status.events() if e.reason == "Forgotten"]
        return [Forgotten(key=e.key, message=e.message, at=e.at.timestamp()) for e in reversed(events)][:50]

    return found


def held_deletion(control: Control) -> HeldSource:
    def held() -> HeldView | None:
        following, summary = _following(control)
        if following:
            raw = summary.held_deletion if summary else None
            if not raw:
                return None
            keys = tuple(str(k) for k in raw.get("keys") or [])
            return HeldView(
                change_id=str(raw.get("changeId") or ""),
                keys=keys,
                count=int(raw.get("count") or len(keys)),
                fleet=int(raw.get("fleet") or 0),
                message=str(raw.get("message") or ""),
            )
        found = control.held_deletion
        if found is None:
            return None
        return HeldView(
            change_id=found.change_id,
            keys=found.keys,
            count=len(found.keys),
            fleet=found.fleet,
            message=found.message(budget=control.budget),
        )

    return held


def provenance(control: ClusterMode) -> Callable[[], str | None]:
    """On a follower: whose summary the leader-only views show and how old it is, or why there is none."""

    def note() -> str | None:
        if control.leading:
            return None
        summary = control.summary_reader.read()
        if summary is None:
            return control.summary_reader.error or "the leader has not published a summary yet"
        return (
            f"as the leader {summary.leader} (term {summary.term}) published it "
            f"{ago(summary.published_at - time.time())}"
        )

    return note


def summary_content(control: ClusterMode, *, owner: str) -> Callable[[], dict[str, Any]]:
    """What the leader publishes (service/kube/summary.py): the views only it can fill."""
    held, pools, forgot = held_deletion(control), pool_statuses(control), forgotten(control)

    def content() -> dict[str, Any]:
        found = held()
        return {
            "heldDeletion": None
            if found is None
            else {
                "changeId": found.change_id,
                "keys": list(found.keys),
                "count": found.count,
                "fleet": found.fleet,
                "message": found.message,
            },
            "stacks": [
                {
                    **dataclasses.asdict(row),
                    "outputs": list(row.outputs),
                    "last_changes": list(row.last_changes),
                }
                for row in _own_stack_rows(control, owner=owner)
            ],
            "pools": {
                key: status.model_dump(mode="json", by_alias=True)
                for key, status in (pools() if pools is not None else {}).items()
            },
            "poolDecisions": [dataclasses.asdict(d) for d in control.pool_history.recent()],
            "forgotten": [dataclasses.asdict(f) for f in forgot()],
        }

    return content
