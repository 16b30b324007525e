"""`proxy-operator up` with the real engine: applies a folder once, prints addresses, exits by the result."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app
from tests.automation.fleet import Fleet, accepts
from tests.conftest import PulumiEnv
from tests.ports import free_port

pytestmark = pytest.mark.engine


def test_up_applies_once_and_reports(pulumi_env: PulumiEnv, tmp_path: Path) -> None:
    fleet = Fleet(root=tmp_path, backend_url=pulumi_env.backend_url)
    port = free_port()
    fleet.write_proxy("once", port=port)
    fleet.write_proxy("lost", provider="nowhere", port=free_port())
    runner = CliRunner()
    try:
        result = runner.invoke(app, ["up", "--manifests", str(fleet.manifests), "--state-dir", str(tmp_path)])
        assert accepts(port)
        assert f"crawl/once\thttp://127.0.0.1:{port}" in result.stdout
        assert "1 proxy address(es), 1 problem(s)" in result.stdout
        # The proxy naming a missing provider makes the run fail, and says why and how to fix it.
        assert result.exit_code == 1
        assert "crawl/lost" in result.stderr
        assert "no provider named 'nowhere'" in result.stderr
    finally:
        fleet.kill_proxies()


def test_up_refuses_a_missing_folder(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["up", "--manifests", str(tmp_path / "absent")], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert "does not exist" in result.output


def test_up_refuses_a_state_folder_inside_the_manifests_folder(tmp_path: Path) -> None:
    """Before: `.state` under the manifests folder was read as manifests (its YAML files, its backend), and
    emptying the manifests folder deleted the passphrase."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    result = CliRunner().invoke(
        app,
        ["up", "--manifests", str(manifests), "--state-dir", str(manifests / ".state")],
        env={"COLUMNS": "300"},
    )
    assert result.exit_code == 2, result.output
    assert "is inside --manifests" in result.output
    assert not (manifests / ".state").exists()  # nothing written there
