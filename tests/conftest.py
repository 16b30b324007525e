"""Shared fixtures: the real Pulumi engine on a file backend in a temporary folder."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.kube_tools_build import SETTLE_SECONDS, SHARE_ENV, BackgroundBuild, needs, run_last, share

# A service the tests run in this process would freeze pytest's own objects out of the garbage collector
# (service/gc_tuning.py) for the rest of the session; tests/service/test_gc_tuning.py turns it on where it
# is what is tested, each in a process of its own. Services the tests start as processes inherit this.
os.environ.setdefault("PROXY_OPERATOR_GC_SETTLE_SECONDS", "0")

ROOT = Path(__file__).resolve().parent.parent
TOOLS_BIN = ROOT / ".tools" / "bin"


@dataclass(frozen=True)
class PulumiEnv:
    """Where a test's Pulumi engine keeps its state."""

    backend_url: str
    backend_dir: Path
    home: Path
    passphrase: str


def _say(config: pytest.Config, line: str) -> None:
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\n[kube-tools] {line}", end="", flush=True)


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """With `make kube-tools` still building beside the suite (scripts/test.sh, tests/kube_tools_build.py),
    the tests that need its programs run last. With PROXY_OPERATOR_TEST_SHARE set, only that share of the
    suite runs (tests/kube_tools_build.py `share`)."""
    if (which := os.environ.get(SHARE_ENV)) and (left := share(items, which)):
        config.hook.pytest_deselected(items=left)
    build = BackgroundBuild.from_env()
    if build is None or build.wait(within=SETTLE_SECONDS) is not None:
        return
    moved = run_last(items)
    _say(
        config, f"still building in the background (log {build.log}): the {moved} tests that need it run last"
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that needs the kube tools waits for its part of their build, and fails (never skips) when it
    failed."""
    build, part = BackgroundBuild.from_env(), needs(item)
    if build is None or part is None:
        return
    code = build.wait(part, say=lambda line: _say(item.config, line))
    if code:
        pytest.fail(build.failure(code), pytrace=False)


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
