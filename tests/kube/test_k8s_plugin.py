"""The Kubernetes provider plugin and the pulumi-kubernetes SDK are the same version.

The SDK asks the engine for the plugin of its own version; the one scripts/install-k8s-plugin.sh builds (the
Go module proxy serves no other way to get it here) must be that version, or the engine would try to
download another, which fails here. The plugin is asked itself, over its gRPC interface.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from importlib.metadata import version
from pathlib import Path

import grpc
import pytest
from google.protobuf import empty_pb2
from pulumi.runtime.proto import provider_pb2_grpc

from tests.kube.apiserver import ROOT, TOOLS_BIN

PLUGIN = TOOLS_BIN / "pulumi-resource-kubernetes"


def pinned() -> str:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [pin] = [d for d in dependencies if d.startswith("pulumi-kubernetes")]
    match = re.fullmatch(r"pulumi-kubernetes==(\d+\.\d+\.\d+)", pin.split("#")[0].strip())
    assert match, f"pyproject.toml must pin pulumi-kubernetes exactly (==X.Y.Z), not {pin!r}"
    return match.group(1)


def test_the_sdk_pin_the_lock_and_the_wrapper_module_agree() -> None:
    want = pinned()
    lock = re.findall(r"^pulumi_kubernetes==(\S+)$", (ROOT / "requirements.lock").read_text(), re.M)
    go_mod = (ROOT / "tools" / "pulumi-kubernetes" / "go.mod").read_text()

    assert lock == [want]
    assert f"github.com/pulumi/pulumi-kubernetes/sdk/v4 v{want} " in go_mod
    assert version("pulumi-kubernetes") == want, "the virtual environment is stale: run make venv"


def plugin_version(plugin: Path) -> str:
    """Start the plugin on its own (it prints its port) and ask it its version."""
    with subprocess.Popen(
        [str(plugin)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True
    ) as process:
        try:
            assert process.stdout is not None
            port = int(process.stdout.readline().strip())
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = provider_pb2_grpc.ResourceProviderStub(channel)
                return str(stub.GetPluginInfo(empty_pb2.Empty(), timeout=30).version)
        finally:
            process.terminate()
            process.wait(timeout=15)


@pytest.mark.kube_tools  # the plugin `make kube-tools` builds
def test_the_plugin_beside_the_cli_is_the_pinned_version() -> None:
    if not PLUGIN.exists():  # also a link into a build cache that is gone
        pytest.fail(
            f"{PLUGIN} is missing: run `make kube-tools` (scripts/install-k8s-plugin.sh)", pytrace=False
        )
    # Beside the CLI: the engine puts the CLI's folder first on PATH, and the CLI uses a plugin on PATH.
    assert (TOOLS_BIN / "pulumi").exists()
    assert plugin_version(PLUGIN) == pinned()
