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


def _recorded_checks(controller) -> list[str]:  # type: ignore[no-untyped-def]
    """Record each `preview --refresh` the controller's engine runs (instrumentation: the real call runs)."""
    calls: list[str] = []
    detect = controller.engine.detect_drift

    def recorded(name: str):  # type: ignore[no-untyped-def]
        calls.append(name)
        return detect(name)

    controller.engine.detect_drift = recorded
    return calls


def _provisioned(controller, key: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    condition = {c.type: c for c in controller.status.get(key).conditions}["Provisioned"]
    return condition.status, condition.reason


@pytest.mark.parametrize("model", ["perProxy", "shared"])
def test_a_resync_of_a_local_stack_whose_processes_run_reads_proc_not_pulumi(
    fleet: Fleet, model: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 20: a resync's drift check of a `local` stack is answered from /proc while every recorded
    process runs and holds its port (a `preview --refresh` of 10,000 proxies took half the two cores for
    six minutes of every ten). Once a process is gone, the refresh runs and reports as before."""
    fleet.write_catalogue(["local"], driftPolicy="detect", processModel=model)
    port, other = free_port(), free_port()
    fleet.write_proxy("victim", port=port)
    fleet.write_proxy("bystander", port=other)

    async def scenario() -> None:
        controller = await fleet.apply()
        checks = _recorded_checks(controller)
        ups_before = controller.engine.up_count("local")

        with caplog.at_level("INFO", logger="automation.reconciler"):
            controller.request_resync()
            await controller.queue.drain()
        assert checks == [], "every process runs: no refresh"
        assert controller.engine.up_count("local") == ups_before
        assert not controller.reconciler.drift_check_due("local"), "the check was answered"
        assert "every applied proxy's process runs and holds its port (no refresh)" in caplog.text
        assert _provisioned(controller, "crawl/victim") == ("True", "Provisioned")
        assert accepts(port)
        assert accepts(other)

        kill_proxy(controller, "crawl/victim")  # with the shared model: the listener of both
        for _ in range(50):
            if not accepts(port):
                break
            await asyncio.sleep(0.1)
        caplog.clear()
        with caplog.at_level("INFO", logger="automation.reconciler"):
            controller.request_resync()
            await controller.queue.drain()
        assert checks == ["local"], "a process is gone: the refresh runs"
        assert "a refresh, because crawl/" in caplog.text
        assert _provisioned(controller, "crawl/victim") == ("False", "ResourcesMissing")
        assert controller.engine.up_count("local") == ups_before, "detect changes nothing"

    asyncio.run(fleet.run(scenario))


def test_the_repair_of_a_proxy_that_fails_its_probes_always_refreshes(fleet: Fleet) -> None:
    """A proxy failing its probes may run and hold its port and still be wrong (a shared listener that no
    longer answers its control socket): its stack's check is Pulumi's refresh even with every process
    running."""
    fleet.write_catalogue(["local"], driftPolicy="detect")
    fleet.write_proxy("flaky", port=free_port())

    async def scenario() -> None:
        controller = await fleet.apply()
        checks = _recorded_checks(controller)
        assert controller.request_repair("crawl/flaky")
        await controller.queue.drain()
        assert checks == ["local"]
        assert _provisioned(controller, "crawl/flaky") == ("True", "Provisioned"), "nothing differed"

    asyncio.run(fleet.run(scenario))


def test_a_restart_with_every_process_running_checks_them_in_proc(fleet: Fleet) -> None:
    """A restarted service checks a `local` stack's processes on its first run; when they all run (only the
    service restarted) that check is /proc's, and nothing runs Pulumi for the stack. The machine-restart case
    (a process gone): `test_a_restart_runs_a_real_change_before_the_process_check_and_keeps_what_it_finds`."""
    fleet.write_catalogue(["local"], driftPolicy="correct")
    port = free_port()
    fleet.write_proxy("survivor", port=port)

    async def scenario() -> None:
        await fleet.apply()
        restarted = fleet.controller()
        checks = _recorded_checks(restarted)
        await fleet.apply(restarted)
        assert checks == []
        assert restarted.engine.up_count("local") == 0, "correct: no `up --refresh` either"
        assert _provisioned(restarted, "crawl/survivor") == ("True", "Provisioned")
        assert accepts(port)

    asyncio.run(fleet.run(scenario))


def test_a_change_with_a_check_due_checks_the_processes_its_up_recorded(fleet: Fleet) -> None:
    """A run with a real change and a drift check due (a resync, a stack's first run after a restart): the
    `up` goes first, then the processes it recorded are checked in /proc; all running, no refresh follows
    (the intake's first `up`s at 10,000 each ran one: 1,501 resources a stack)."""
    fleet.write_catalogue(["local"], driftPolicy="detect")
    fleet.write_proxy("first", port=free_port())

    async def scenario() -> None:
        controller = await fleet.apply()
        checks = _recorded_checks(controller)
        ups_before = controller.engine.up_count("local")
        added = free_port()
        fleet.write_proxy("added", port=added)
        controller.sync(submit=False)  # a folder is read once it held still for one poll
        assert controller.sync(submit=False) == {"local"}  # the change is planned first: one run, both
        controller.request_resync()
        await controller.queue.drain()
        assert controller.engine.up_count("local") == ups_before + 1
        assert checks == [], "the processes the `up` recorded all run"
        assert accepts(added)
        assert not controller.reconciler.drift_check_due("local")

    asyncio.run(fleet.run(scenario))
