"""What the page reads from the control loop; imported by serve only (the settings import
`service.ui.settings`, and must not import the loop through this package).

The stacks view's rows: the queue's states and the names of the outputs of each stack's last `up`, no
Pulumi CLI call; a follower has no loop, so it shows none (docs/operations.md). The pools view's statuses:
the pool source's, in directory mode."""

from __future__ import annotations

import time
from collections.abc import Sequence

from service.controller import Controller
from service.incluster import ClusterMode
from service.pools.source import PoolSource
from service.ui.context import StackRow, StacksSource
from service.ui.pools import PoolsSource


def stack_rows(control: Controller | ClusterMode, *, owner: str) -> StacksSource:
    """`owner`: this installation's name, which every stack it manages is tagged with."""

    def rows() -> Sequence[StackRow]:
        loop = control.controller if isinstance(control, ClusterMode) else control
        if loop is None:
            return []
        found = []
        for name, state in sorted(loop.queue.states().items()):
            outputs = loop.reconciler.applied_outputs(name)
            error = state.last_error
            found.append(
                StackRow(
                    name=name,
                    owner=owner,
                    state=state.state.value,
                    runs=state.runs,
                    consecutive_failures=state.consecutive_failures,
                    reason=state.reason,
                    error=str(error) if error else None,
                    next_retry_at=_wall(state.next_retry_at),
                    outputs=sorted(outputs),
                )
            )
        return found

    return rows


def _wall(monotonic: float | None) -> float | None:
    """The queue's retry time is on the monotonic clock; the page shows wall time."""
    return None if monotonic is None else time.time() + (monotonic - time.monotonic())


def pool_statuses(control: Controller | ClusterMode) -> PoolsSource | None:
    if isinstance(control, Controller) and isinstance(control.source, PoolSource):
        source = control.source
        return lambda: dict(source.status)
    return None
