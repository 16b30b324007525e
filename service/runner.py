"""What the CLI's `up` and `serve` do, as functions the tests call too."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from automation.engine import Engine
from automation.queue_state import QueueState
from service.config import OperatorSettings, check_folders
from service.controller import Controller
from service.inventory import Inventory
from service.pools.wiring import pooled_directory
from service.sources.directory import DirectorySource

log = logging.getLogger(__name__)


@dataclass
class ApplyReport:
    """What one `up` pass did: per stack its queue state, per proxy its address or problem."""

    stacks: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    held: dict[str, str] = field(default_factory=dict)  # proxies running their last applied version: why
    held_deletion: str | None = None  # a change the deletion budget stopped: what to do

    @property
    def ok(self) -> bool:
        return not self.errors and not self.problems and not self.held and self.held_deletion is None

    def problem_lines(self) -> list[str]:
        lines = [f"problem: {p}" for p in self.problems]
        lines += [f"error: {name}: {error}" for name, error in sorted(self.errors.items())]
        lines += [f"held: {key}: {why}" for key, why in sorted(self.held.items())]
        if self.held_deletion is not None:
            lines.append(f"stopped: {self.held_deletion}")
        return lines

    def address_lines(self) -> list[str]:
        summary = (
            f"{len(self.stacks)} stack(s), {len(self.addresses)} proxy address(es), "
            f"{len(self.errors) + len(self.problems)} problem(s)"
        )
        return [f"{key}\t{address}" for key, address in sorted(self.addresses.items())] + [summary]


def build_controller(
    settings: OperatorSettings, manifests: Path, *, inventory: Inventory | None = None
) -> Controller:
    # ProxyPools expand into child Proxies between the folder and the controller (service/pools); given the
    # serving inventory they also rotate and replace children from its health.
    check_folders(settings, manifests)
    source = pooled_directory(DirectorySource(manifests), inventory=inventory)
    controller = Controller(
        settings=settings,
        engine=Engine(settings.engine_config()),
        source=source,
        inventory=inventory if inventory is not None else Inventory(),
    )
    source.ready = lambda: controller.backend_seen  # pools decide once the backend's stacks were read
    return controller


async def apply_once(
    settings: OperatorSettings, manifests: Path, *, allow_deletions: Iterable[str] = ()
) -> ApplyReport:
    """Reconcile the folder once: every stack it changes, and every stack it empties, then return.
    `allow_deletions`: ids of changes the deletion budget stopped that may go ahead this time."""
    controller = build_controller(settings, manifests)
    controller.gate.quiet = 0.0  # one read is the whole change: nothing more arrives to wait for
    for change_id in allow_deletions:
        controller.gate.allowances.grant(change_id)  # named up front: it lets exactly that change go
    try:
        await controller.start()
        await _settle(controller)
        return _report(controller)
    finally:
        await controller.close()


async def _settle(controller: Controller) -> None:
    """Drain the queue, including the follow-up runs that releases (deletions) trigger."""
    while True:
        await controller.queue.drain()
        due = controller.gate.due_in()  # deletions waiting for the deletion window's quiet point
        if due is not None:
            await asyncio.sleep(due + 0.01)
        if not controller.sync() and controller.gate.due_in() is None:
            return


def _report(controller: Controller) -> ApplyReport:
    report = ApplyReport(problems=[str(p) for p in controller.source.problems])
    for name, state in controller.queue.states().items():
        report.stacks[name] = str(state.state)
        if state.state in (QueueState.FAILED, QueueState.STALLED, QueueState.BACKOFF) and state.last_error:
            report.errors[name] = f"{state.last_error.reason}: {state.last_error.message}"
    for key, error in controller.planner.rejected.items():
        if controller.planner.held_version(key) is None:
            report.errors[key] = f"{error.reason}: {error.message}"
    for key, held in controller.status.held().items():
        report.held[key] = f"{held.reason}: {held.message}"
    if controller.held_deletion is not None:
        report.held_deletion = controller.held_deletion.message(budget=controller.budget)
    for endpoint in controller.inventory.endpoints():
        if endpoint.has_address:
            report.addresses[endpoint.key] = f"{endpoint.protocol}://{endpoint.host}:{endpoint.port}"
    return report


def install_stop_signals(stop: asyncio.Event) -> Callable[[], None]:
    """First Ctrl-C / SIGTERM: stop cleanly (running pulumi operations get SIGINT and cancel)."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    def remove() -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)

    return remove
