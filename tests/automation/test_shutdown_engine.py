"""Shutdown while `up` runs: the `pulumi` child gets SIGINT, cancels cleanly, and leaves no lock."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from tests.automation.eventually import eventually
from tests.automation.fleet import Fleet, accepts
from tests.conftest import PulumiEnv
from tests.ports import free_port

pytestmark = pytest.mark.engine


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (any command)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # gone meanwhile
        if int(text[text.rindex(")") + 2 :].split()[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def pulumi_descendants(pid: int) -> list[int]:
    """The `pulumi` processes below `pid` (each runs under its watchdog, a child of ours)."""
    found, todo = [], children(pid)
    while todo:
        child = todo.pop()
        try:
            comm = Path(f"/proc/{child}/comm").read_text().strip()
        except OSError:
            continue
        if comm == "pulumi":
            found.append(child)
        else:
            todo += children(child)
    return found


def running_up(locks: Path) -> int | None:
    """The pid of our `pulumi up` child once it holds the stack's lock and its engine has started the
    program (the language host is its child). Before that point the CLI has not installed its SIGINT
    handler yet; and `stack init` takes a lock too, which is not the `up` this test interrupts."""
    for lock in locks.rglob("*.json"):
        try:
            pid = int(json.loads(lock.read_text())["pid"])
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, KeyError):
            continue  # being written, or just released
        if pid in pulumi_descendants(os.getpid()) and b"up" in argv and children(pid):
            return pid
    return None


def test_close_interrupts_a_running_up_and_leaves_no_lock(fleet: Fleet, pulumi_env: PulumiEnv) -> None:
    ports = {name: free_port() for name in ("s1", "s2", "s3")}
    for name, port in ports.items():
        fleet.write_proxy(name, port=port)
    locks = pulumi_env.backend_dir / ".pulumi" / "locks"

    async def scenario() -> None:
        controller = fleet.controller()
        fleet._controllers.append(controller)
        await controller.start()
        await eventually(lambda: running_up(locks), within=120, what="`pulumi up` holding the stack's lock")

        await controller.close(grace=60)

        assert pulumi_descendants(os.getpid()) == []
        assert not list(locks.rglob("*.json")), "the interrupted up left its lock"
        # Interrupted, not finished: the operation raised "update canceled", and Pulumi recorded the
        # update as failed.
        assert [stack for stack, _, _ in controller.engine.ups] == ["local"]
        error = controller.queue.status("local").last_error
        assert error is not None, "the up finished: nothing raised"
        assert "update canceled" in error.message
        info = controller.engine.info("local")
        assert (info.last_operation, info.last_result) == ("update", "failed")

        # The state is consistent: the next run applies without any manual step.
        again = await fleet.apply()
        assert sorted(e.key for e in again.inventory.endpoints()) == ["crawl/s1", "crawl/s2", "crawl/s3"]
        assert all(accepts(port) for port in ports.values())

    asyncio.run(fleet.run(scenario))
