"""Where the engine finds the Pulumi CLI: the setting, then PATH, then the checkout's `.tools/bin`."""

from __future__ import annotations

from pathlib import Path

import pytest

from automation.engine import config
from automation.engine.config import EngineConfig, PulumiNotFoundError, find_pulumi


def _cli(folder: Path) -> Path:
    folder.mkdir(parents=True)
    path = folder / "pulumi"
    path.write_text("#!/bin/sh\necho v0\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    found = {
        "setting": _cli(tmp_path / "setting"),
        "path": _cli(tmp_path / "on-path"),
        "checkout": _cli(tmp_path / "checkout" / ".tools" / "bin"),
    }
    monkeypatch.setenv("PATH", str(found["path"].parent))
    monkeypatch.setattr(config, "CHECKOUT_PULUMI", found["checkout"])
    return found


def test_the_setting_wins(places: dict[str, Path]) -> None:
    assert find_pulumi(places["setting"]) == places["setting"]


def test_then_path(places: dict[str, Path]) -> None:
    assert find_pulumi(None) == places["path"]


def test_then_the_checkout(places: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    assert find_pulumi(None) == places["checkout"]


def test_none_is_a_clear_error(
    places: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    monkeypatch.setattr(config, "CHECKOUT_PULUMI", tmp_path / "no-checkout" / "pulumi")
    with pytest.raises(PulumiNotFoundError, match="PROXY_OPERATOR_PULUMI_PATH"):
        find_pulumi(None)


def test_a_setting_that_is_no_executable_is_refused(places: dict[str, Path]) -> None:
    places["setting"].chmod(0o644)
    with pytest.raises(PulumiNotFoundError, match="is not an executable file"):
        find_pulumi(places["setting"])


def test_the_engine_puts_the_cli_folder_first_on_path(places: dict[str, Path], tmp_path: Path) -> None:
    engine = config.EngineConfig(backend_url="file:///x", state_dir=tmp_path, pulumi=places["setting"])
    assert engine.environment()["PATH"].split(":")[0] == str(places["setting"].parent)


def test_every_cli_call_runs_with_grpcs_fork_handlers_off(tmp_path: Path) -> None:
    """A dynamic provider that forks and execs (libvirt's ssh transport) lost its child to gRPC's fork
    handlers (grpc/grpc#13873), seen on the test KVM host: every CLI call, so every program and provider
    process, runs with them off."""
    engine = EngineConfig(backend_url="file:///x", state_dir=tmp_path, pulumi=tmp_path / "pulumi")
    assert engine.environment()["GRPC_ENABLE_FORK_SUPPORT"] == "false"
