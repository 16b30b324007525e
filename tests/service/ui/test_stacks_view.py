"""The stacks view: each stack's last update (kind, result, when, how long, resource counts) and its lock,
read from what the control loop keeps, no CLI call. The loop is real; its engine is the recording stand-in
(tests/automation/standin_engine.py), made to fail on a lock held by another replica."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

from automation.errors import StackLockedError
from automation.queue_state import QueueState, StackQueueState
from service.controller import Controller
from service.ui.context import StackRow
from service.ui.sources import RUNNING_HERE, _stack_row, desired_hashes, lock_of, stack_rows
from service.ui.views import render_stacks
from tests.automation.standin_engine import RecordingEngine
from tests.service.test_declared_deletion import Folder, apply, make_controller


def observed(controller: Controller, key: str) -> str | None:
    status = controller.status.published(key)
    return status.observed_spec_hash if status is not None else None


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        self.now += 1.5  # each reading 1.5 s later: an update takes 1.5 s
        return self.now


class LockedElsewhere(RecordingEngine):
    """Its `up` fails the way the engine translates a lock of another replica."""

    locked: bool = False

    def up(self, spec, *, refresh=False):  # type: ignore[no-untyped-def]
        if self.locked:
            raise StackLockedError(
                "stack local is locked by another operation", holders=("root@pod-b (pid 7)",)
            )
        return super().up(spec, refresh=refresh)


def test_a_stack_row_carries_its_last_update_and_the_lock_someone_else_holds(tmp_path: Path) -> None:
    folder, engine = Folder(tmp_path / "m"), LockedElsewhere(installation="ours")

    async def scenario() -> tuple[list[StackRow], list[StackRow]]:
        folder.proxy("a", port=3001)
        controller = make_controller(folder, engine, tmp_path / "s")
        controller.reconciler.updates.clock = Clock()
        rows, desired = stack_rows(controller, owner="ours"), desired_hashes(controller)
        await apply(controller)
        applied = list(rows())
        assert desired("crawl/a") == observed(controller, "crawl/a")  # up to date
        engine.locked = True
        folder.proxy("a", port=3002)
        await apply(controller)
        locked = list(rows())
        assert desired("crawl/a") not in (None, observed(controller, "crawl/a"))  # the edit waits
        assert desired("crawl/nope") is None
        await controller.close(grace=1)
        return applied, locked

    [applied], [locked] = asyncio.run(scenario())
    assert (applied.owner, applied.last_kind, applied.last_result) == ("ours", "up", "succeeded")
    assert applied.last_changes == ("create 1",)  # the engine's resource_changes
    assert applied.last_seconds == 1.5
    assert applied.last_started_at is not None
    assert applied.lock is None
    assert (locked.last_kind, locked.last_result, locked.last_reason) == ("up", "failed", "StackLocked")
    assert locked.last_changes == ()
    assert locked.lock == "held by root@pod-b (pid 7)"
    published = json.loads(json.dumps(dataclasses.asdict(locked)))  # what a leader publishes to followers
    assert _stack_row(published) == locked  # ...and what a follower's page reads back
    assert _stack_row(json.loads(json.dumps(dataclasses.asdict(applied)))) == applied


def test_a_running_stack_holds_its_lock_here_and_a_follower_says_the_leader_holds_it() -> None:
    assert lock_of(StackQueueState(stack="s", state=QueueState.RUNNING)) == "held by this replica (running)"
    assert lock_of(StackQueueState(stack="s", state=QueueState.IDLE)) is None
    running = dataclasses.asdict(StackRow(name="s", owner="o", state="running", lock=RUNNING_HERE))
    assert _stack_row(json.loads(json.dumps(running))).lock == "held by the leader (running)"


def test_the_stacks_view_shows_owner_last_update_counts_and_lock() -> None:
    row = StackRow(
        name="gcp-eu",
        owner="prod",
        state="backoff",
        runs=4,
        reason="StackLocked",
        last_kind="up",
        last_result="failed",
        last_reason="StackLocked",
        last_started_at=1_800_000_000.0,
        last_seconds=2.25,
        last_changes=(),
        lock="held by root@pod-b (pid 7)",
        outputs=("proxies", "specHash"),
    )
    done = dataclasses.replace(
        row, name="local", state="idle", last_result="succeeded", last_reason=None, lock=None
    )
    done = dataclasses.replace(done, last_changes=("create 2", "same 5"))
    html = render_stacks([row, done], [], root="", text="")
    cells = html.split("<tr>")[2].split("</td>")
    assert "prod" in cells[1]  # the Owner column holds the owner
    assert "backoff" in cells[2]
    assert "up <span" in cells[5]
    assert "failed</span> (StackLocked), 2.2 s" in cells[5]
    assert "held by root@pod-b (pid 7)" in cells[6]
    assert "create 2, same 5" in html.split("<tr>")[3]
