"""The reconciler with the real Pulumi engine and the `local` provider: real proxy processes on loopback.

Nothing here is mocked: the engine (`CountingEngine`) is the real one, instrumented to count its `up` runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from automation.queue_state import QueueState
from tests.automation.eventually import eventually
from tests.automation.fleet import Fleet, accepts, kill_up_holding_lock
from tests.conftest import PulumiEnv
from tests.ports import free_port

pytestmark = pytest.mark.engine


def components(controller, stack: str) -> list[str]:
    deployment = controller.engine.export(stack)["deployment"]
    return sorted(
        r["urn"].rsplit("::", 1)[-1]
        for r in deployment.get("resources", [])
        if r["type"] == "proxy-operator:index:Proxy"
    )


def test_create_modify_delete_and_restart(fleet: Fleet) -> None:
    async def scenario() -> None:
        a, b, b2 = free_port(), free_port(), free_port()
        fleet.write_proxy("a", port=a)
        fleet.write_proxy("b", port=b)
        controller = await fleet.apply()
        assert accepts(a)
        assert accepts(b)
        assert controller.status.get("crawl/a").phase == "Ready"
        assert {e.key for e in controller.inventory.endpoints()} == {"crawl/a", "crawl/b"}
        assert controller.engine.up_count("local") == 1

        # A port change replaces that proxy's process and leaves its neighbour alone.
        fleet.write_proxy("b", port=b2)
        await fleet.apply(controller)
        assert accepts(b2)
        assert not accepts(b)
        assert accepts(a)
        assert controller.inventory.get("crawl/b").port == b2
        assert controller.engine.up_count("local") == 2

        # Deleting a proxy removes its resources, then releases it.
        fleet.remove_proxy("a")
        await fleet.apply(controller)
        assert not accepts(a)
        assert components(controller, "local") == ["crawl/b"]
        assert controller.inventory.get("crawl/a") is None
        assert "crawl/a" not in {p.key for p in controller.source.proxies()}
        assert [e.reason for e in controller.status.events("crawl/a")][-1] == "Released"

        # A restart with nothing changed runs no `up`: the applied hash is read back from the stack.
        restarted = await fleet.apply()
        assert restarted.engine.up_count("local") == 0
        assert restarted.inventory.get("crawl/b").port == b2

    asyncio.run(fleet.run(scenario))


def test_skip_cleanup_forgets_and_keeps_the_process(fleet: Fleet) -> None:
    async def scenario() -> None:
        keep, other = free_port(), free_port()
        fleet.write_proxy("keep", port=keep)
        fleet.write_proxy("other", port=other)
        controller = await fleet.apply()
        assert accepts(keep)

        # The annotation must be on the object when it is deleted (as on a Proxy in the cluster).
        fleet.write_proxy("keep", port=keep, annotations={"crawl.example.com/skip-cleanup": "true"})
        await fleet.apply(controller)
        fleet.remove_proxy("keep")
        await fleet.apply(controller)

        assert accepts(keep), "skip-cleanup must leave the real proxy running"
        assert components(controller, "local") == ["crawl/other"]
        forgotten = [e for e in controller.status.events("crawl/keep") if e.reason == "Forgotten"]
        assert forgotten
        assert "crawl/keep" in forgotten[0].message
        assert "LocalProxy" in forgotten[0].message

    asyncio.run(fleet.run(scenario))


def test_provider_emptied_destroys_and_removes_the_stack(fleet: Fleet) -> None:
    async def scenario() -> None:
        port = free_port()
        fleet.write_proxy("only", port=port)
        controller = await fleet.apply()
        assert controller.engine.list_stack_names() == ["local"]

        fleet.remove_proxy("only")
        await fleet.apply(controller)
        assert not accepts(port)
        assert controller.engine.list_stack_names() == []

    asyncio.run(fleet.run(scenario))


def test_bad_proxy_beside_good_ones(fleet: Fleet) -> None:
    async def scenario() -> None:
        good = free_port()
        fleet.write_proxy("good", port=good)
        fleet.write_proxy("lost", provider="nowhere", port=free_port())
        fleet.write_proxy("wrongblock", port=free_port(), gcp={"machineType": "e2-micro"})
        controller = await fleet.apply()

        assert accepts(good)
        assert components(controller, "local") == ["crawl/good"]
        lost = controller.status.get("crawl/lost")
        assert lost.phase == "Stalled"  # waits for its input to change: no retry loop
        assert "no provider named 'nowhere'" in lost.conditions[0].message
        wrong = controller.status.get("crawl/wrongblock").conditions[0]
        assert wrong.reason == "InvalidInput"
        assert "spec.gcp" in wrong.message
        # The missing provider is reported, not retried in a loop: its stack never ran.
        assert controller.engine.up_count("nowhere") == 0

    asyncio.run(fleet.run(scenario))


def test_invalid_edit_keeps_the_last_good_version(fleet: Fleet) -> None:
    async def scenario() -> None:
        port = free_port()
        fleet.write_proxy("steady", port=port)
        controller = await fleet.apply()
        # A typo in the provider's block must not delete a running proxy.
        fleet.write_proxy("steady", port=port, kvm={"vcpus": 2})
        await fleet.apply(controller)
        assert accepts(port)
        assert components(controller, "local") == ["crawl/steady"]
        assert controller.status.get("crawl/steady").conditions[-1].reason == "InvalidInput"

    asyncio.run(fleet.run(scenario))


def test_two_stacks_run_in_parallel(pulumi_env: PulumiEnv, tmp_path: Path) -> None:
    fleet = Fleet(root=tmp_path, backend_url=pulumi_env.backend_url, providers=["east", "west"])

    async def scenario() -> None:
        fleet.write_proxy("e", provider="east", port=free_port())
        fleet.write_proxy("w", provider="west", port=free_port())
        controller = await fleet.apply()
        runs = {name: (start, end) for name, start, end in controller.engine.ups}
        assert set(runs) == {"east", "west"}
        (s1, e1), (s2, e2) = runs["east"], runs["west"]
        assert s1 < e2, f"the two stacks' `up` runs did not overlap: {runs}"
        assert s2 < e1, f"the two stacks' `up` runs did not overlap: {runs}"

    try:
        asyncio.run(fleet.run(scenario))
    finally:
        fleet.kill_proxies()


def test_ten_quick_changes_coalesce(fleet: Fleet) -> None:
    """Ten changes submitted while the stack's `up` runs make one more run, not ten.

    Each change is polled twice so that it passes the directory source's debounce (the folder holds still
    for one poll) and reaches the queue as a real submit: without that, the queue would be handed nothing
    and a queue that never coalesces would pass too.
    """
    fleet.write_proxy("busy", port=free_port())

    async def scenario() -> None:
        controller = fleet.controller()
        fleet._controllers.append(controller)
        submits: list[str] = []
        submit = controller.queue.submit

        def counting_submit(stack: str, **kwargs: Any) -> None:
            submits.append(stack)
            submit(stack, **kwargs)

        controller.queue.submit = counting_submit  # type: ignore[method-assign]
        await controller.start()
        queue = controller.queue
        await eventually(
            lambda: queue.status("local").state is QueueState.RUNNING, within=60, what="the first run"
        )
        submits.clear()  # the first load's submits
        ports = []
        for _ in range(10):
            ports.append(free_port())
            fleet.write_proxy("busy", port=ports[-1])
            assert controller.sync() == set(), "the source hands on a folder only once it holds still"
            assert controller.sync() == {"local"}
            assert queue.status("local").state is QueueState.RUNNING, "the first run ended too soon"
        assert submits == ["local"] * 10

        await fleet.apply(controller)
        assert queue.status("local").runs == 2, "ten submits during a run must make one follow-up run"
        assert controller.engine.up_count("local") <= 2
        assert accepts(ports[-1]), "the last change must be the one applied"

    asyncio.run(fleet.run(scenario))


def test_stale_lock_of_a_killed_up_is_recovered(fleet: Fleet) -> None:
    async def scenario() -> None:
        port = free_port()
        fleet.write_proxy("locked", port=port)
        controller = await fleet.apply()
        fleet.write_proxy("locked", port=port, protocol="socks5")
        # An `up` of the same stack killed right after it took the lock (a crash, an OOM kill).
        locks, victim_pid = await asyncio.to_thread(kill_up_holding_lock, controller.engine, "local")
        assert json.loads(next(locks.rglob("*.json")).read_text())["pid"] == victim_pid

        await fleet.apply(controller)
        assert not list(locks.rglob("*.json"))
        assert controller.queue.status("local").last_error is None
        assert controller.engine.up_count("local") == 2

    asyncio.run(fleet.run(scenario))


def test_skip_cleanup_behind_a_stale_lock_recovers_it_and_forgets(fleet: Fleet) -> None:
    """The forget of a skip-cleanup deletion (export, edit, import) recovers a dead holder's lock as an
    `up` does. Found by the faults campaign: an `up` killed at a handover left its lock, and the new
    leader's forget failed on it forever (StackLocked on every retry; the Proxy stuck in Deleting)."""

    async def scenario() -> None:
        keep, other = free_port(), free_port()
        fleet.write_proxy("keep", port=keep, annotations={"crawl.example.com/skip-cleanup": "true"})
        fleet.write_proxy("other", port=other)
        controller = await fleet.apply()
        locks, victim_pid = await asyncio.to_thread(kill_up_holding_lock, controller.engine, "local")
        assert json.loads(next(locks.rglob("*.json")).read_text())["pid"] == victim_pid

        fleet.remove_proxy("keep")
        await fleet.apply(controller)
        assert controller.queue.status("local").last_error is None
        assert not list(locks.rglob("*.json"))
        assert components(controller, "local") == ["crawl/other"]
        assert accepts(keep), "skip-cleanup must leave the real proxy running"
        assert [e for e in controller.status.events("crawl/keep") if e.reason == "Forgotten"]

    asyncio.run(fleet.run(scenario))


def test_an_unusable_backend_at_start_is_reported_and_retried(
    pulumi_env: PulumiEnv, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = tmp_path / "unusable-backend"
    backend.write_text("this is a file, not a state folder\n")
    fleet = Fleet(root=tmp_path / "fleet", backend_url=backend.as_uri())
    port = free_port()
    fleet.write_proxy("a", port=port)

    async def scenario() -> None:
        controller = fleet.controller()
        fleet._controllers.append(controller)
        controller.settings = controller.settings.model_copy(update={"poll_seconds": 0.2})
        listings: list[float] = []
        list_stack_names = controller.engine.list_stack_names

        def counting_list() -> list[str]:
            listings.append(time.monotonic())
            return list_stack_names()

        controller.engine.list_stack_names = counting_list  # type: ignore[method-assign]
        stop = asyncio.Event()
        loop = asyncio.create_task(controller.run(stop))  # `serve`'s loop: it must survive the backend
        try:
            await eventually(lambda: len(listings) >= 3, within=60, what="the listing to be tried again")
            reported = [
                r for r in caplog.records if r.name == "service.controller" and r.levelno == logging.ERROR
            ]
            assert len(reported) >= 2, "each failed attempt is reported"
            assert all("backend" in r.getMessage() for r in reported), reported
            assert controller.queue.states() == {}, "nothing may run before the backend was read"
            assert not loop.done()

            # The backend becomes usable: the next poll reads it and the stack is reconciled.
            backend.unlink()
            backend.mkdir()
            await eventually(lambda: accepts(port), within=120, what="the proxy to be provisioned")
            await controller.queue.drain()
            assert controller.engine.list_stack_names() == ["local"]
            assert controller.queue.status("local").last_error is None
            assert controller.status.get("crawl/a").phase == "Ready"
        finally:
            stop.set()
            await loop

    try:
        asyncio.run(fleet.run(scenario))
    finally:
        fleet.kill_proxies()
