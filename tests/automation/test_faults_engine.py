"""Fault injection with the real engine: nothing but a declared deletion removes a running proxy.

Each fault is applied by a fresh controller (a restart between the bad edit and the run: the harder case,
since the controller knows only what the backend's stack outputs say), the running `local` proxies must keep
listening as the same processes and carry a condition naming the fault; fixing the input brings everything
back to Ready without an `up` that replaces anything. Nothing is mocked: real Pulumi CLI, real pproxy
processes on loopback, a file backend in the test's folder.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from service.runner import _report
from tests.automation.fleet import Fleet, accepts
from tests.conftest import PulumiEnv
from tests.ports import free_port

pytestmark = pytest.mark.engine

SECRET = "proxy-auth"


def _secret_doc(**data: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": "crawl"},
        **data,
    }


def _write_secret(fleet: Fleet, doc: dict | None) -> None:
    path = fleet.manifests / "secret.yaml"
    if doc is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(yaml.safe_dump(doc))


def _baseline(fleet: Fleet) -> dict[str, int]:
    ports = {"a": free_port(), "b": free_port(), "s": free_port()}
    fleet.write_proxy("a", port=ports["a"])
    fleet.write_proxy("b", port=ports["b"])
    fleet.write_proxy("s", port=ports["s"], auth={"mode": "secret", "secretRef": {"name": SECRET}})
    _write_secret(fleet, _secret_doc(stringData={"username": "crawler", "password": "s3cret-pass"}))
    return ports


def _pids(fleet: Fleet) -> set[int]:
    out = subprocess.run(["pgrep", "-f", str(fleet.local_state)], capture_output=True, text=True)
    return {int(pid) for pid in out.stdout.split()}


def _held(controller, key: str) -> str | None:
    """The reason of the proxy's Held=True condition, or of its failed Provisioned condition."""
    for condition in controller.status.get(key).conditions:
        if condition.type == "Held" and condition.status == "True":
            return condition.reason
    return None


# fault name -> (break the input, the proxies it affects -> expected reason, fix the input)
Fault = tuple[
    Callable[[Fleet, dict[str, int]], None], dict[str, str], Callable[[Fleet, dict[str, int]], None]
]


def _yaml_error(fleet: Fleet, ports: dict[str, int]) -> None:
    (fleet.manifests / "proxy-a.yaml").write_text("kind: Proxy\nmetadata: {name: a\n")


def _schema_error(fleet: Fleet, ports: dict[str, int]) -> None:
    fleet.write_proxy("a", port="eighteen")


def _port_out_of_range(fleet: Fleet, ports: dict[str, int]) -> None:
    fleet.write_proxy("a", port=70000)


def _provider_typo(fleet: Fleet, ports: dict[str, int]) -> None:
    fleet.write_proxy("a", port=ports["a"], provider="locl")


def _no_catalogue(fleet: Fleet, ports: dict[str, int]) -> None:
    (fleet.manifests / "catalogue.yaml").unlink()
    fleet.remove_proxy("b")  # a removal in the same change is not declared either: the read is incomplete


def _missing_secret(fleet: Fleet, ports: dict[str, int]) -> None:
    _write_secret(fleet, None)


def _garbled_secret(fleet: Fleet, ports: dict[str, int]) -> None:
    _write_secret(fleet, _secret_doc(data={"username": "not base64!", "password": "***"}))


def _emptied_folder(fleet: Fleet, ports: dict[str, int]) -> None:
    for path in fleet.manifests.iterdir():
        path.unlink()


def _restore(fleet: Fleet, ports: dict[str, int]) -> None:
    fleet.write_catalogue(fleet.providers)
    fleet.write_proxy("a", port=ports["a"])
    fleet.write_proxy("b", port=ports["b"])
    fleet.write_proxy("s", port=ports["s"], auth={"mode": "secret", "secretRef": {"name": SECRET}})
    _write_secret(fleet, _secret_doc(stringData={"username": "crawler", "password": "s3cret-pass"}))


FAULTS: dict[str, Fault] = {
    "yaml-syntax-error": (_yaml_error, {"crawl/a": "ManifestUnreadable"}, _restore),
    "port-not-a-number": (_schema_error, {"crawl/a": "InvalidSpec"}, _restore),
    "port-out-of-range": (_port_out_of_range, {"crawl/a": "InvalidSpec"}, _restore),
    "provider-typo": (_provider_typo, {"crawl/a": "UnknownProvider"}, _restore),
    "catalogue-missing": (_no_catalogue, {"crawl/b": "NotDeclared"}, _restore),
    "secret-missing": (_missing_secret, {"crawl/s": "CredentialsMissing"}, _restore),
    "secret-garbled": (_garbled_secret, {"crawl/s": "CredentialsMissing"}, _restore),
    "folder-emptied": (
        _emptied_folder,
        {"crawl/a": "NotDeclared", "crawl/b": "NotDeclared", "crawl/s": "NotDeclared"},
        _restore,
    ),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_fault_holds_running_proxies_and_a_fix_restores_them(fleet: Fleet, fault: str) -> None:
    breaks, expected, fixes = FAULTS[fault]

    async def scenario() -> None:
        ports = _baseline(fleet)
        first = await fleet.apply()
        assert _report(first).ok, _report(first).problem_lines()
        pids = _pids(fleet)
        assert len(pids) == 3

        breaks(fleet, ports)
        faulty = await fleet.apply()  # a fresh controller: a restart between the bad edit and the run
        report = _report(faulty)
        assert not report.ok, "a fault must be reported (exit 1 for `up`)"
        assert all(accepts(port) for port in ports.values()), f"{fault}: a running proxy stopped"
        assert _pids(fleet) == pids, f"{fault}: a proxy process was replaced"
        for key, reason in expected.items():
            assert _held(faulty, key) == reason, (key, faulty.status.get(key).conditions)
            assert faulty.inventory.get(key) is not None, f"{key} is still served by discovery"
        assert faulty.engine.up_count("local") == 0, "holding is a no-change for the stack"

        fixes(fleet, ports)
        fixed = await fleet.apply()
        assert _report(fixed).ok, _report(fixed).problem_lines()
        assert fixed.engine.up_count("local") == 0, "the fix brings back what runs: nothing to apply"
        assert _pids(fleet) == pids
        for key in ("crawl/a", "crawl/b", "crawl/s"):
            assert fixed.status.get(key).phase == "Ready", (key, fixed.status.get(key).conditions)

    asyncio.run(fleet.run(scenario))


def test_faults_in_a_running_controller_then_an_explicit_removal(fleet: Fleet) -> None:
    """The same controller sees a YAML error, a typo and a restore; then one removal removes exactly one."""

    async def scenario() -> None:
        ports = _baseline(fleet)
        controller = await fleet.apply()
        pids = _pids(fleet)

        _yaml_error(fleet, ports)
        _provider_typo(fleet, ports)  # rewrites proxy-a.yaml: valid YAML, unknown provider
        _no_catalogue(fleet, ports)
        await fleet.apply(controller)
        assert _held(controller, "crawl/a") == "UnknownProvider"
        assert _held(controller, "crawl/b") == "NotDeclared"
        assert all(accepts(port) for port in ports.values())
        assert controller.engine.up_count("local") == 1, "only the first apply ran an up"

        _restore(fleet, ports)
        await fleet.apply(controller)
        assert _pids(fleet) == pids
        assert all(controller.status.get(k).phase == "Ready" for k in ("crawl/a", "crawl/b", "crawl/s"))
        assert controller.engine.up_count("local") == 1

        fleet.remove_proxy("b")  # declared: removed from a complete read
        await fleet.apply(controller)
        assert not accepts(ports["b"])
        assert accepts(ports["a"])
        assert accepts(ports["s"])
        assert len(_pids(fleet)) == 2
        assert [e.reason for e in controller.status.events("crawl/b")][-1] == "Released"

    asyncio.run(fleet.run(scenario))


def test_a_second_installation_on_the_same_backend_touches_nothing(
    pulumi_env: PulumiEnv, tmp_path: Path
) -> None:
    ours = Fleet(root=tmp_path / "ours", backend_url=pulumi_env.backend_url)
    theirs = Fleet(root=tmp_path / "theirs", backend_url=pulumi_env.backend_url)

    async def scenario() -> None:
        port = free_port()
        ours.write_proxy("a", port=port)
        mine = await ours.apply()
        assert _report(mine).ok
        # Another installation, same backend, a catalogue entry of the same name and other proxies.
        theirs.write_proxy("z", port=free_port())
        other = await theirs.apply()
        report = _report(other)
        assert "local" in report.errors
        assert "StackNotOwned" in report.errors["local"]
        assert accepts(port)
        assert other.engine.up_count("local") == 0
        # Our installation still manages it (a restart reads the same owner tag back).
        again = await ours.apply()
        assert _report(again).ok
        assert again.engine.up_count("local") == 0

    try:
        asyncio.run(ours.run(lambda: theirs.run(scenario)))
    finally:
        ours.kill_proxies()
        theirs.kill_proxies()


def test_up_stops_a_large_removal_and_allow_deletions_lets_that_change_through(fleet: Fleet) -> None:
    """The one-shot `up` path (`apply_once`, what `proxy-operator up` calls) with the real engine."""
    from service.runner import apply_once

    async def scenario() -> None:
        ports = {f"p{i}": free_port() for i in range(7)}
        for name, port in ports.items():
            fleet.write_proxy(name, port=port)
        settings = fleet.settings()
        assert (await apply_once(settings, fleet.manifests)).ok
        for name in list(ports)[:6]:
            fleet.remove_proxy(name)
        stopped = await apply_once(settings, fleet.manifests)
        assert not stopped.ok
        assert stopped.held_deletion is not None
        assert all(accepts(port) for port in ports.values()), "nothing was removed"
        change = stopped.held_deletion.split("allow change ")[1].split()[0]
        assert any(line.startswith("stopped: ") for line in stopped.problem_lines())

        wrong = await apply_once(settings, fleet.manifests, allow_deletions=["000000000000"])
        assert wrong.held_deletion is not None
        assert all(accepts(port) for port in ports.values())

        allowed = await apply_once(settings, fleet.manifests, allow_deletions=[change])
        assert allowed.ok, allowed.problem_lines()
        assert [accepts(port) for port in ports.values()] == [False] * 6 + [True]

    asyncio.run(fleet.run(scenario))


def test_a_manifest_restored_byte_for_byte_ends_its_hold(fleet: Fleet) -> None:
    """The file of a running proxy stops parsing, then comes back exactly as it was: the proxy is Ready
    again. Before: its content equalled what the source had emitted, so the reread carried no upsert and no
    hold, the controller did not report the source's holds, and the proxy stayed Held (ManifestUnreadable)
    until some other change (found by the fleet page's browser test)."""

    async def scenario() -> None:
        ports = _baseline(fleet)
        controller = await fleet.apply()
        before = (fleet.manifests / "proxy-a.yaml").read_bytes()
        _yaml_error(fleet, ports)
        await fleet.apply(controller)
        assert _held(controller, "crawl/a") == "ManifestUnreadable"
        (fleet.manifests / "proxy-a.yaml").write_bytes(before)
        await fleet.apply(controller)
        assert _held(controller, "crawl/a") is None, controller.status.get("crawl/a").conditions
        assert controller.status.get("crawl/a").phase == "Ready"

    asyncio.run(fleet.run(scenario))
