"""Each engine operation gives the CLI and its plugins a temporary folder of its own (`TMPDIR`) and removes
it when the operation ends, even a failed one: the Kubernetes plugin leaves a kubeconfig given as content
there at each start (docs/security.md). The real CLI on a file backend of the test's own; the plugin's own
behaviour is checked with a real kubeconfig Secret in tests/kube/test_kubernetes_program_engine.py."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from automation.engine import Engine, EngineConfig, scratch
from tests.conftest import PulumiEnv

pytestmark = pytest.mark.engine


def test_an_operation_has_a_temporary_folder_of_its_own_removed_at_its_end(
    pulumi_env: PulumiEnv, tmp_path: Path
) -> None:
    engine = Engine(EngineConfig(backend_url=pulumi_env.backend_url, state_dir=tmp_path / "state"))
    seen = []
    for _ in range(2):
        with engine._operation("scratch", "up") as (stack, _events):
            scratch = Path(stack.workspace.env_vars["TMPDIR"])
            assert scratch.is_dir()
            (scratch / "kubeconfig123").write_text("left by a plugin")
            seen.append(scratch)
        assert not scratch.exists(), "the operation's temporary folder outlived it"
    assert seen[0] != seen[1], "two operations shared a temporary folder"

    failed: list[Path] = []

    def fail() -> None:
        with engine._operation("scratch", "up") as (stack, _events):
            failed.append(Path(stack.workspace.env_vars["TMPDIR"]))
            raise RuntimeError("the operation failed")

    with pytest.raises(RuntimeError):
        fail()
    assert not failed[0].exists(), "a failed operation's temporary folder outlived it"


def test_the_folders_of_killed_processes_are_swept_and_no_others(tmp_path: Path) -> None:
    """A process killed mid-operation cannot remove its folder (where a plugin may have left a kubeconfig):
    the next process's first operation does. Real processes: one that ran and is gone, and this one. A
    folder named in another pid namespace (a temporary folder shared with another container) is not judged:
    its pid means nothing here."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)  # fmt: skip
    namespace = os.stat("/proc/self/ns/pid").st_ino
    dead = tmp_path / f"{scratch.PREFIX}{namespace}-{gone.stdout.strip()}-abc123"
    dead.mkdir()
    (dead / "kubeconfig123").write_text("credentials a killed operation left")
    live = tmp_path / f"{scratch.PREFIX}{namespace}-{os.getpid()}-def456"
    live.mkdir()
    elsewhere = tmp_path / f"{scratch.PREFIX}{namespace + 1}-{gone.stdout.strip()}-ghi789"
    elsewhere.mkdir()
    old_style = tmp_path / f"{scratch.PREFIX}{gone.stdout.strip()}-x1y2z3"  # no namespace: not ours to judge
    old_style.mkdir()
    other = tmp_path / "unrelated-123-x"
    other.mkdir()
    assert scratch.sweep(tmp_path) == [dead]
    assert not dead.exists()
    assert live.is_dir()
    assert elsewhere.is_dir()
    assert old_style.is_dir()
    assert other.is_dir()


def test_an_operation_s_folder_names_its_process(pulumi_env: PulumiEnv, tmp_path: Path) -> None:
    engine = Engine(EngineConfig(backend_url=pulumi_env.backend_url, state_dir=tmp_path / "state"))
    with engine._operation("scratch", "up") as (stack, _events):
        name = Path(stack.workspace.env_vars["TMPDIR"]).name
    assert name.startswith(f"{scratch.PREFIX}{os.stat('/proc/self/ns/pid').st_ino}-{os.getpid()}-")


def test_a_state_import_leaves_no_file_behind_even_when_it_fails(
    pulumi_env: PulumiEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forget of a skip-cleanup deletion imports an edited state. The SDK's `import_stack` wrote that
    state, its secrets decrypted, to the system's temporary folder and left it there when the import failed
    (a held lock, a term that ended); the engine writes it in the operation's folder and removes it either
    way. The real CLI on a file backend; the failure is a state the CLI refuses."""
    from pulumi import automation as auto

    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))  # where the SDK's file would go
    engine = Engine(EngineConfig(backend_url=pulumi_env.backend_url, state_dir=tmp_path / "state"))
    files: list[Path] = []
    run = engine._run

    def recording(workspace: Any, args: list[str]) -> Any:
        if "import" in args:
            files.append(Path(args[args.index("--file") + 1]))
            assert files[-1].is_file()
        return run(workspace, args)

    monkeypatch.setattr(engine, "_run", recording)
    with engine._operation("imports", "forget") as (stack, _events):
        folder = Path(stack.workspace.env_vars["TMPDIR"])
        exported = stack.export_stack()
        engine._import_state(
            "imports", stack, {"version": exported.version, "deployment": exported.deployment}
        )
        with pytest.raises(auto.errors.CommandError):
            engine._import_state("imports", stack, {"version": 3, "deployment": {"resources": "not a list"}})
        assert [file.parent for file in files] == [folder, folder]
        assert not any(file.exists() for file in files), "a state file outlived its import"
    assert list(system_tmp.iterdir()) == [], "something was left in the system's temporary folder"
