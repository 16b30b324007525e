"""proxy-operator installed from its wheel works away from its checkout: `preview`, `up`, the language host.

The wheel is built from a copy of the source, installed into a fresh virtual environment, and run from an
unrelated folder with the checkout out of reach: no PYTHONPATH, PATH holding the new environment, a folder
with only the `pulumi` binary, and the system's. The dependencies come from the checkout's environment through
a `.pth` line (a real install of them downloads ~630 MiB and took 79 s here, with no pip cache to reuse; see
docs/operations.md): a `.pth` line adds that folder to the import path but runs none of its own `.pth` files,
so the checkout's editable install stays inert and our three packages come from the wheel, which the test
checks. `pip check` proves the wheel's declared dependencies are met by the locked versions.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.automation.fleet import accepts
from tests.automation.local_example import LocalExample
from tests.conftest import ROOT, TOOLS_BIN

pytestmark = pytest.mark.engine

# What a source distribution holds: everything but local state, caches and build output.
_NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".tools",
    ".state",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
)


@dataclass(frozen=True)
class Installed:
    root: Path
    venv: Path
    env: dict[str, str]

    def run(self, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        command = [str(self.venv / "bin" / "proxy-operator"), *args]
        return subprocess.run(command, cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout)


def _build_wheel(root: Path) -> Path:
    source = root / "source"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCE)
    dist = root / "dist"
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)]
    subprocess.run(pip, check=True, capture_output=True, timeout=300)
    (wheel,) = dist.glob("proxy_operator-*.whl")
    return wheel


def _install(root: Path, wheel: Path) -> Path:
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (purelib / "checkout_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q"]
    subprocess.run([*pip, "--no-deps", str(wheel)], check=True, capture_output=True, timeout=300)
    return venv


def _cli_alone(root: Path) -> Path:
    """A folder holding only the `pulumi` binary: nothing of the checkout's .tools/bin beside it."""
    folder = root / "cli"
    folder.mkdir()
    try:
        os.link(TOOLS_BIN / "pulumi", folder / "pulumi")
    except OSError:
        shutil.copy2(TOOLS_BIN / "pulumi", folder / "pulumi")
    return folder


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("installed")
    venv = _install(root, _build_wheel(root))
    backend = root / "backend"
    backend.mkdir()
    env = {
        "PATH": os.pathsep.join(
            [str(venv / "bin"), str(_cli_alone(root)), "/usr/local/bin", "/usr/bin", "/bin"]
        ),
        "HOME": str(root),
        "LANG": "C.UTF-8",
        "PULUMI_HOME": str(root / "pulumi-home"),
        "PULUMI_BACKEND_URL": backend.as_uri(),
        "PULUMI_CONFIG_PASSPHRASE": "installed-test",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PROXY_OPERATOR_STATE_DIR": str(root / "state"),
    }
    return Installed(root=root, venv=venv, env=env)


def test_the_wheel_carries_the_program_and_the_plugins(installed: Installed) -> None:
    python = str(installed.venv / "bin" / "python")
    where = (
        "import automation, service, stacks; print(automation.__file__, service.__file__, stacks.__file__)"
    )
    imported = subprocess.run(
        [python, "-c", where],
        cwd=installed.root,
        env=installed.env,
        capture_output=True,
        text=True,
        check=True,
    )
    for path in imported.stdout.split():
        assert Path(path).is_relative_to(installed.venv), f"{path} is not from the installed wheel"
    site = Path(imported.stdout.split()[2]).parent.parent
    assert (site / "stacks" / "__main__.py").is_file()
    for plugin in ("proxy-operator", "pulumi-language-python", "pulumi-resource-pulumi-python"):
        assert (installed.venv / "bin" / plugin).is_file(), plugin
    check = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_preview_and_up_run_from_an_unrelated_folder(installed: Installed) -> None:
    example = LocalExample(installed.root / "example")
    elsewhere = installed.root / "elsewhere"
    elsewhere.mkdir()
    manifests = str(example.manifests)
    try:
        first = _preview(installed, manifests, cwd=elsewhere)
        assert first["totals"]["create"] == 3
        assert sorted(first["stacks"][0]["proxies"]["create"]) == example.keys

        up = installed.run("up", "--manifests", manifests, cwd=elsewhere)
        assert up.returncode == 0, up.stdout + up.stderr
        for name, port in example.ports.items():
            assert f"default/{name}\thttp://127.0.0.1:{port}" in up.stdout, up.stdout
            assert accepts(port), f"{name} does not answer on {port}"
        assert not (elsewhere / ".state").exists(), "PROXY_OPERATOR_STATE_DIR was not used"

        # --all runs the program again (through the installed language host) against the applied stack.
        again = _preview(installed, manifests, "--all", cwd=elsewhere)
        assert again["stacks"][0]["previewed"] is True
        assert not any(again["stacks"][0]["proxies"].values()), again
    finally:
        _destroy(installed, stack="local")
        assert example.kill_processes() == [], "pulumi destroy left proxies running"


def _preview(installed: Installed, manifests: str, *extra: str, cwd: Path) -> dict[str, Any]:
    result = installed.run("preview", "--manifests", manifests, "--json", *extra, cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    assert report["ok"], report
    return report


def _destroy(installed: Installed, *, stack: str) -> None:
    """Stop the proxies `up` started, with the installed plugins: `pulumi destroy` in the stack's work dir."""
    work = Path(installed.env["PROXY_OPERATOR_STATE_DIR"]) / "work" / stack
    if not work.is_dir():
        return
    env = {**installed.env, "PULUMI_PYTHON_CMD": str(installed.venv / "bin" / "python")}
    pulumi = str(installed.root / "cli" / "pulumi")
    command = [pulumi, "destroy", "--yes", "--skip-preview", "--non-interactive", "--stack", stack]
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(command, cwd=work, env=env, capture_output=True, timeout=300, check=False)
