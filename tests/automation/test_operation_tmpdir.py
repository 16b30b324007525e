"""Each engine operation gives the CLI and its plugins a temporary folder of its own (`TMPDIR`) and removes
it when the operation ends, even a failed one: the Kubernetes plugin leaves a kubeconfig given as content
there at each start (docs/security.md). The real CLI on a file backend of the test's own; the plugin's own
behaviour is checked with a real kubeconfig Secret in tests/kube/test_kubernetes_program_engine.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from automation.engine import Engine, EngineConfig
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
