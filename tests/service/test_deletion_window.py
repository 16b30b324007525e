"""The deletion budget over a window (service/deletions.py): a mass deletion spread over polls is held.

The review's finding: 20 deletions in one poll were held, the same 20 in five polls of four all went.
The stand-in engine records every removed proxy (tests/automation/standin_engine.py); the folder source is
real; the controller's clock is a fake one here, moved by hand, so the window's quiet point is exact.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from automation.deletion_budget import change_id
from service.deletions import Allowances
from service.runner import _settle
from tests.automation.standin_engine import RecordingEngine
from tests.service.test_declared_deletion import Folder, apply, make_controller

FLEET = [f"p{i:02d}" for i in range(20)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def fleet_of_20(folder: Folder, engine: RecordingEngine, tmp_path: Path, **overrides: object):  # type: ignore[no-untyped-def]
    folder.catalogue("local")
    for i, name in enumerate(FLEET):
        folder.proxy(name, port=3000 + i)
    controller = make_controller(folder, engine, tmp_path / "s", **overrides)  # type: ignore[arg-type]
    return await apply(controller)


def test_deletions_spread_over_polls_count_together(tmp_path: Path) -> None:
    """Quiet point 0 (each poll judged at once): the removals still add up over the window, so at most
    the budget's share of the fleet goes without an allowance."""
    folder, engine = Folder(tmp_path / "m"), RecordingEngine(installation="ours")

    async def scenario() -> None:
        controller = await fleet_of_20(folder, engine, tmp_path)
        for batch in range(5):
            for name in FLEET[batch * 4 : batch * 4 + 4]:
                folder.remove(f"proxy-{name}.yaml")
            await apply(controller)
        removed = sorted(set(engine.backend.destroyed))
        assert len(removed) <= 10, f"{len(removed)} of 20 removed over five polls: the budget was evaded"
        held = controller.held_deletion
        assert held is not None
        assert "already removed in this deletion window" in held.message(budget=controller.budget)
        assert len(held.keys) + len(removed) == 20

    asyncio.run(scenario())


def test_a_mass_deletion_arriving_within_the_quiet_period_is_one_change(tmp_path: Path) -> None:
    folder, engine, clock = Folder(tmp_path / "m"), RecordingEngine(installation="ours"), Clock()

    async def scenario() -> None:
        controller = await fleet_of_20(folder, engine, tmp_path, deletion_window_quiet_seconds=2.0)
        controller.gate._monotonic = clock  # the window's clock, moved by hand
        for batch in range(5):
            for name in FLEET[batch * 4 : batch * 4 + 4]:
                folder.remove(f"proxy-{name}.yaml")
            controller.sync()
            controller.sync()  # the folder held still for one poll: its deletions are declared
            await controller.queue.drain()
            clock.now += 1.0  # each poll within the quiet period of the one before
            assert engine.backend.destroyed == [], "a deletion went before the window's quiet point"
        clock.now += 2.0
        controller.sync()
        held = controller.held_deletion
        assert held is not None, "20 of 20 went: the window was not judged as one change"
        assert held.keys == tuple(f"crawl/{name}" for name in FLEET)
        assert held.change_id == change_id(held.keys)

        assert controller.allow_deletions(held.change_id)
        await _settle(controller)
        assert sorted(engine.backend.destroyed) == sorted(f"crawl/{name}" for name in FLEET)

    asyncio.run(scenario())


def test_an_unknown_change_id_is_refused_and_recorded_nowhere(tmp_path: Path) -> None:
    """POST /v1/deletions/{id}/allow answered 404 but recorded the id: the change with that id, when it
    came, went through unheld."""
    folder, engine = Folder(tmp_path / "m"), RecordingEngine(installation="ours")

    async def scenario() -> None:
        controller = await fleet_of_20(folder, engine, tmp_path)
        coming = change_id(f"crawl/{name}" for name in FLEET[:12])
        assert not controller.allow_deletions(coming)
        for name in FLEET[:12]:
            folder.remove(f"proxy-{name}.yaml")
        await apply(controller)
        assert engine.backend.destroyed == []
        assert controller.held_deletion is not None
        assert controller.held_deletion.change_id == coming

    asyncio.run(scenario())


def test_an_allowance_survives_a_change_of_term(tmp_path: Path) -> None:
    """Allowed while one controller (term) ran, the change is removed by the next one, without asking
    again; then the allowance is used up."""
    folder, engine = Folder(tmp_path / "m"), RecordingEngine(installation="ours")
    allowances = Allowances()

    async def scenario() -> None:
        first = await fleet_of_20(folder, engine, tmp_path)
        first.gate.allowances = allowances
        for name in FLEET[:12]:
            folder.remove(f"proxy-{name}.yaml")
        first.sync()
        first.sync()  # the folder held still for one poll
        held = first.held_deletion
        assert held is not None
        assert first.gate.allow(held.change_id)  # allowed; the term ends before it acted on it
        await first.close(grace=0.1)
        assert engine.backend.destroyed == []
        assert allowances.ids == {held.change_id}, "the allowance was used up before anything was removed"

        second = make_controller(folder, engine, tmp_path / "s")
        second.gate.allowances = allowances
        await apply(second)
        assert sorted(set(engine.backend.destroyed)) == sorted(held.keys)
        assert allowances.ids == set(), "used up once its proxies were released"
        await second.close(grace=1)

    asyncio.run(scenario())


def test_the_fleet_is_counted_only_when_a_deletion_is_declared(tmp_path: Path) -> None:
    """The window's fleet (`Planner.applied_count`, a walk of every applied proxy) is counted when a
    deletion opens or joins a window, not on every poll: at 10,000 proxies that walk was 2.4 % of the
    leader's event loop (bench_running run 39, py-spy), once a second and after every slice of an intake."""
    folder, engine = Folder(tmp_path / "m"), RecordingEngine(installation="ours")

    async def scenario() -> None:
        controller = await fleet_of_20(folder, engine, tmp_path)
        counted = 0
        applied_count = controller.planner.applied_count

        def counting() -> int:
            nonlocal counted
            counted += 1
            return applied_count()

        controller.planner.applied_count = counting  # type: ignore[method-assign]
        for _ in range(3):
            controller.sync()  # nothing changed
        assert counted == 0, "a poll with no deletion walked the fleet"
        folder.remove("proxy-p00.yaml")
        controller.sync()
        controller.sync()  # held still for one poll: declared
        assert counted >= 1
        window = controller.gate.window
        assert window is not None
        assert window.fleet == 20

    asyncio.run(scenario())
