"""Shutdown while `up` runs: the `pulumi` child gets SIGINT, cancels cleanly, and leaves no lock."""

from __future__ import annotations

import asyncio
import os

import pytest

from automation.engine.children import pulumi_children
from tests.automation.fleet import Fleet, free_port
from tests.conftest import PulumiEnv

pytestmark = pytest.mark.engine


def test_close_interrupts_a_running_up_and_leaves_no_lock(fleet: Fleet, pulumi_env: PulumiEnv) -> None:
    for name in ("s1", "s2", "s3"):
        fleet.write_proxy(name, port=free_port())
    locks = pulumi_env.backend_dir / ".pulumi" / "locks"

    async def scenario() -> None:
        controller = fleet.controller()
        fleet._controllers.append(controller)
        await controller.start()
        for _ in range(600):  # wait until `pulumi up` runs and holds the stack's lock
            if pulumi_children(os.getpid()) and list(locks.rglob("*.json")):
                break
            await asyncio.sleep(0.01)
        assert pulumi_children(os.getpid()), "no pulumi child ever ran"
        await controller.close(grace=60)
        assert pulumi_children(os.getpid()) == []
        assert not list(locks.rglob("*.json")), "the interrupted up left its lock"

        # The state is consistent: the next run applies without any manual step.
        again = await fleet.apply()
        assert sorted(e.key for e in again.inventory.endpoints()) == ["crawl/s1", "crawl/s2", "crawl/s3"]

    asyncio.run(fleet.run(scenario))
