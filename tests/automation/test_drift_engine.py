"""Drift after a proxy process is killed out of band, with the real engine: `detect` vs `correct`."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from tests.automation.fleet import Fleet, accepts
from tests.ports import free_port

pytestmark = pytest.mark.engine


def kill_proxy(controller, key: str) -> None:
    """Kill the proxy's process out of band, as a crash or an operator would."""
    deployment = controller.engine.export("local")["deployment"]
    name = key
    pid = next(
        int(r["outputs"]["pid"])
        for r in deployment["resources"]
        if r["type"].endswith("LocalProxy") and r["urn"].endswith(f"::{name}")
    )
    os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("policy", ["detect", "correct"])
def test_drift_policy_after_a_proxy_process_dies(fleet: Fleet, policy: str) -> None:
    fleet.write_catalogue(["local"], driftPolicy=policy)
    port, other = free_port(), free_port()
    fleet.write_proxy("victim", port=port)
    fleet.write_proxy("bystander", port=other)

    async def scenario() -> None:
        controller = await fleet.apply()
        kill_proxy(controller, "crawl/victim")
        for _ in range(50):
            if not accepts(port):
                break
            await asyncio.sleep(0.1)
        ups_before = controller.engine.up_count("local")

        controller.request_resync()
        await controller.queue.drain()

        events = [e for e in controller.status.events() if e.reason == "DriftDetected"]
        if policy == "detect":
            assert not accepts(port), "detect must change nothing"
            assert controller.engine.up_count("local") == ups_before
            assert events, "detect must report the drift"
            assert events[0].key == "crawl/victim"
            assert "LocalProxy" in events[0].message
        else:
            assert accepts(port), "correct must rebuild the vanished proxy"
            assert controller.engine.up_count("local") == ups_before + 1
        assert accepts(other)

    asyncio.run(fleet.run(scenario))


def test_a_restart_runs_a_real_change_before_the_process_check_and_keeps_what_it_finds(fleet: Fleet) -> None:
    """A restarted controller checks a `local` stack's processes on its first run (they may have died with
    the machine). When that run has a real change, the `up` goes first and the check after it (issue 20:
    a change does not wait for a `preview --refresh`), and a dead process the check finds stays reported
    (Provisioned False), where the `up`'s report used to mark it Provisioned again."""
    fleet.write_catalogue(["local"], driftPolicy="detect")
    port, changed = free_port(), free_port()
    fleet.write_proxy("victim", port=port)
    fleet.write_proxy("changed", port=changed)

    async def scenario() -> None:
        first = await fleet.apply()
        kill_proxy(first, "crawl/victim")
        for _ in range(50):
            if not accepts(port):
                break
            await asyncio.sleep(0.1)
        moved = free_port()
        fleet.write_proxy("changed", port=moved)

        restarted = fleet.controller()
        calls: list[str] = []
        up, detect = restarted.engine.up, restarted.engine.detect_drift

        def recorded_up(spec, *, refresh=False):  # type: ignore[no-untyped-def]
            calls.append("up")
            return up(spec, refresh=refresh)

        def recorded_detect(name: str):  # type: ignore[no-untyped-def]
            calls.append("detect")
            return detect(name)

        restarted.engine.up = recorded_up  # type: ignore[method-assign]
        restarted.engine.detect_drift = recorded_detect  # type: ignore[method-assign]
        await fleet.apply(restarted)

        assert calls == ["up", "detect"]
        assert accepts(moved), "the change was applied"
        assert not accepts(port), "detect changes nothing"
        provisioned = {c.type: c for c in restarted.status.get("crawl/victim").conditions}["Provisioned"]
        assert (provisioned.status, provisioned.reason) == ("False", "ResourcesMissing"), provisioned
        changed_status = {c.type: c for c in restarted.status.get("crawl/changed").conditions}["Provisioned"]
        assert changed_status.status == "True"

    asyncio.run(fleet.run(scenario))
