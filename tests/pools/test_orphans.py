"""`proxy-operator orphans` with the real engine: a local proxy process whose stack state was deleted is
found (and only it: a process a stack still holds is not), and `--delete --yes` stops it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, cast

import pytest
import typer
from typer.testing import CliRunner

from automation.engine.errors import STACK_NOT_FOUND
from automation.errors import InvalidInputError
from automation.orphans import LocalProcess, Orphan, known_instance_ids, local_orphans
from service.cli_orphans import _stored, find_orphans, orphans
from tests.automation.fleet import Fleet, accepts
from tests.conftest import PulumiEnv
from tests.ports import free_port


def test_process_of_a_deleted_stack_state_is_an_orphan(pulumi_env: PulumiEnv, fleet_ab: Fleet) -> None:
    port_a, port_b = free_port(), free_port()
    fleet_ab.write_proxy("pa", provider="a", port=port_a)
    fleet_ab.write_proxy("pb", provider="b", port=port_b)
    asyncio.run(fleet_ab.run(lambda: _apply(fleet_ab)))
    assert accepts(port_a)
    assert accepts(port_b)
    settings = fleet_ab.settings()
    assert find_orphans(settings, fleet_ab.manifests) == []

    backend = Path(pulumi_env.backend_url.removeprefix("file://"))
    [state] = list(backend.rglob("stacks/*/b.json"))
    state.unlink()  # the stack's state is gone; its process runs on

    [orphan] = find_orphans(settings, fleet_ab.manifests)
    assert orphan.provider == "b"
    assert orphan.kind == "process"

    app = typer.Typer()
    app.command()(orphans)
    args = ["--manifests", str(fleet_ab.manifests), "--state-dir", str(settings.state_dir)]
    result = CliRunner().invoke(app, [*args, "--delete"], input="n\n")
    assert result.exit_code == 1, result.output  # refused at the confirmation: nothing deleted
    assert accepts(port_b)
    result = CliRunner().invoke(app, [*args, "--delete", "--yes"])
    assert result.exit_code == 0, result.output
    assert "deleted 1 orphan(s)" in result.output
    _wait_closed(port_b)
    assert accepts(port_a)  # held by stack a: not an orphan


async def _apply(fleet: Fleet) -> None:
    await fleet.apply()


def _wait_closed(port: int) -> None:
    deadline = time.monotonic() + 10
    while accepts(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not accepts(port)


def test_only_processes_under_our_state_dirs_and_in_no_state(tmp_path: Path) -> None:
    ours, other = tmp_path / "ours", tmp_path / "other"
    processes = [
        LocalProcess(10, 100, ours / "crawl-a.json"),  # held by a stack
        LocalProcess(11, 101, ours / "crawl-b.json"),  # orphan
        LocalProcess(12, 102, other / "crawl-c.json"),  # another installation's folder
    ]
    known = known_instance_ids([{"proxies": {"crawl/a": {"instanceId": "10-100"}}}, {}])
    found = local_orphans(processes, state_dirs={"local": ours}, known=known)
    assert found == [
        Orphan("local", "process", "11-101", f"pid 11, config {ours}/crawl-b.json", processes[1])
    ]


def test_a_stack_removed_between_the_list_and_its_export_holds_nothing() -> None:
    """Seen in tests/kvm: the service removed a stack whose last Proxy was forgotten while
    `proxy-operator orphans` read the listed stacks; any other refusal still fails."""

    class Engine:
        def __init__(self, reason: str) -> None:
            self.reason = reason

        def export_stored(self, name: str) -> dict[str, Any]:
            raise InvalidInputError(f"stack {name}: no", reason=self.reason)

    assert _stored(cast(Any, Engine(STACK_NOT_FOUND)), "kvm-test") == {}
    with pytest.raises(InvalidInputError):
        _stored(cast(Any, Engine("InvalidInput")), "kvm-test")
