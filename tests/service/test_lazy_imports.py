"""The lazy imports of issue 20: `serve` in a cluster does not import the Pulumi SDK (about 33 MiB of RSS
with gRPC and protobuf) until a leader's first CLI call. Each check runs in a fresh interpreter: the test
process itself has imported everything already. The follower that runs against an API server is in
tests/kube/test_follower.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import PulumiEnv
from tests.service.follower_modules import HEAVY

ROOT = Path(__file__).resolve().parents[2]

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: none, user: {token: unused}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


def fresh(args: list[str], *, cwd: Path = ROOT, env: dict[str, str] | None = None) -> dict[str, list[str]]:
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_in_cluster_service_is_built_without_the_engine_sdk(tmp_path: Path) -> None:
    """The CLI imported and every part of `serve --kubeconfig` built (the engine among them): none of the
    modules only a leader's operations need."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    found = fresh(["-m", "tests.service.follower_modules", str(kubeconfig), "default", str(tmp_path / "s")])
    assert found["built"] == [], f"a follower's import set regained {found['built']}"
    # the same build, another wiring: the credentials reader and the leader's writer share their copies, and
    # the writer forgets a deleted Secret (tests/kube/test_credentials_secrets.py)
    assert found["credentials_wired"], "CredentialsReader and CredentialsWriter are not wired to each other"


def test_in_a_pod_the_service_is_built_without_the_kubeconfig_loader(tmp_path: Path) -> None:
    """Configured as in a pod (a ServiceAccount folder, no kubeconfig): nor the `kubernetes` package's
    other features, nor its kubeconfig loader with requests and oauthlib (service/lean_packages.py)."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("unused")
    (account / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\nunused\n-----END CERTIFICATE-----\n")
    (account / "namespace").write_text("default")
    pod = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "9"}
    args = ["-m", "tests.service.follower_modules", str(account), "default", str(tmp_path / "s")]
    found = fresh(args, env=pod)
    assert found["built"] == [], f"a replica in a pod imported {found['built']}"
    assert found["credentials_wired"]


def test_the_engine_imports_the_sdk_at_its_first_call(pulumi_env: PulumiEnv, tmp_path: Path) -> None:
    """The other half: an `Engine` is made without the SDK, and its first read imports it and works."""
    script = f"""
import json, sys
from pathlib import Path
from automation.engine import Engine
from service.config import OperatorSettings
names = {list(HEAVY)!r}
engine = Engine(OperatorSettings(state_dir=Path({str(tmp_path / "s")!r})).engine_config())
before = [n for n in names if n in sys.modules]
stacks = engine.list_stack_names()
print(json.dumps({{"before": before, "after": [n for n in names if n in sys.modules], "stacks": stacks}}))
"""
    found = fresh(["-c", script])
    assert found["before"] == []
    assert {"pulumi", "pulumi.automation", "grpc", "automation.engine.command"} <= set(found["after"])
    assert found["stacks"] == []
