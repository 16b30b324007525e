"""Shared fixtures: the real Pulumi engine on a file backend in a temporary folder."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLS_BIN = ROOT / ".tools" / "bin"


@dataclass(frozen=True)
class PulumiEnv:
    """Where a test's Pulumi engine keeps its state."""

    backend_url: str
    backend_dir: Path
    home: Path
    passphrase: str


def _require_engine() -> None:
    # A missing engine is a broken install, not a reason to skip: `make tools` builds it.
    for binary in ("pulumi", "pulumi-language-python", "pulumi-resource-pulumi-python"):
        if not (TOOLS_BIN / binary).exists():
            pytest.fail(f"{TOOLS_BIN / binary} is missing: run `make tools` first")


@pytest.fixture(scope="session")
def pulumi_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One PULUMI_HOME per run: nothing of the developer's ~/.pulumi leaks in or out.
    return tmp_path_factory.mktemp("pulumi-home")


@pytest.fixture
def pulumi_env(tmp_path: Path, pulumi_home: Path, monkeypatch: pytest.MonkeyPatch) -> PulumiEnv:
    """Put the project's Pulumi CLI and language host on PATH, with a `file://` backend in tmp_path."""
    _require_engine()
    backend = tmp_path / "backend"
    backend.mkdir()
    venv_bin = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", os.pathsep.join([str(TOOLS_BIN), venv_bin, os.environ.get("PATH", "")]))
    monkeypatch.setenv("PULUMI_HOME", str(pulumi_home))
    monkeypatch.setenv("PULUMI_BACKEND_URL", backend.as_uri())
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "test-passphrase")
    monkeypatch.setenv("PULUMI_SKIP_UPDATE_CHECK", "true")
    monkeypatch.setenv("PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION", "true")
    assert shutil.which("pulumi") == str(TOOLS_BIN / "pulumi")
    return PulumiEnv(
        backend_url=backend.as_uri(), backend_dir=backend, home=pulumi_home, passphrase="test-passphrase"
    )
