"""`proxy-operator orphans` on a kubernetes entry, against the test API server with the real engine and the
real Kubernetes provider plugin (tests/kube/conftest.py; no kubelet: PROXY_OPERATOR_K8S_BARE_APISERVER=1, as
in test_kubernetes_program_engine.py).

One proxy is applied; then two Deployments are made by hand with our labels and no stack holding them: one
with this installation's id, one with another's. `orphans` lists only the first (not the stack's objects,
not the other installation's), and `--delete --yes` removes it and nothing else.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest
from kubernetes import client as kube_client
from kubernetes.client import ApiClient
from typer.testing import CliRunner

from service.cli import app
from service.cli_orphans import find_orphans
from stacks.marks import K8S_INSTALLATION
from stacks.programs.kubernetes import BARE_APISERVER_ENV
from tests.conftest import PulumiEnv
from tests.kube.apiserver import TOOLS_BIN, KubeApi
from tests.kube.program_fleet import ClusterObjects, KubeFleet, create_namespace

pytestmark = pytest.mark.engine

PLUGIN = TOOLS_BIN / "pulumi-resource-kubernetes"


@pytest.fixture
def target(kube_client: ApiClient) -> str:
    name = f"px-{secrets.token_hex(4)}"
    create_namespace(kube_client, name)
    return name


@pytest.fixture
def fleet(
    pulumi_env: PulumiEnv, tmp_path: Path, kube_api: KubeApi, target: str, monkeypatch: pytest.MonkeyPatch
) -> KubeFleet:
    if not PLUGIN.exists():
        pytest.fail(
            f"{PLUGIN} is missing: run `make kube-tools` (scripts/install-k8s-plugin.sh)", pytrace=False
        )
    monkeypatch.setenv("KUBECONFIG", str(kube_api.kubeconfig))
    monkeypatch.setenv(BARE_APISERVER_ENV, "1")
    return KubeFleet(root=tmp_path, backend_url=pulumi_env.backend_url, namespace=target)


def _stray(api: ApiClient, namespace: str, name: str, installation: str) -> None:
    labels = {
        "app.kubernetes.io/managed-by": "proxy-operator",
        K8S_INSTALLATION: installation,
        "app.kubernetes.io/instance": name,
    }
    pod = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "proxy", "image": "3proxy"}]}}
    body = {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app.kubernetes.io/instance": name}},
            "template": pod,
        },
    }
    kube_client.AppsV1Api(api).create_namespaced_deployment(namespace, body)


def test_orphans_lists_only_this_installations_unheld_objects_and_deletes_them(
    fleet: KubeFleet, kube_client: ApiClient, target: str
) -> None:
    fleet.write_proxy("web", port=8080)
    asyncio.run(fleet.run(lambda: _apply(fleet)))
    settings = fleet.settings()
    installation = settings.installation_name()
    objects = ClusterObjects(kube_client, target)
    web = objects.deployment("px-crawl-web")
    assert web.metadata.labels[K8S_INSTALLATION] == installation
    assert K8S_INSTALLATION not in web.spec.template.metadata.labels  # no rollout when it was added
    assert find_orphans(settings, fleet.manifests) == []  # the stack holds all four of its objects

    _stray(kube_client, target, "px-stray", installation)
    _stray(kube_client, target, "px-foreign", "another-installation")

    [orphan] = find_orphans(settings, fleet.manifests)
    assert (orphan.provider, orphan.kind, orphan.id) == ("in-cluster", "Deployment", f"{target}/px-stray")

    args = ["orphans", "--manifests", str(fleet.manifests), "--state-dir", str(settings.state_dir)]
    refused = CliRunner().invoke(app, [*args, "--delete"], input="n\n")
    assert refused.exit_code == 1, refused.output
    assert objects.deployment("px-stray") is not None
    result = CliRunner().invoke(app, [*args, "--delete", "--yes"])
    assert result.exit_code == 0, result.output
    assert f"in-cluster\tDeployment\t{target}/px-stray" in result.output
    assert "deleted 1 orphan(s)" in result.output
    assert objects.deployment("px-stray") is None
    assert objects.deployment("px-foreign") is not None  # another installation's: not ours to judge
    assert objects.deployment("px-crawl-web") is not None
    assert objects.service("px-crawl-web") is not None


async def _apply(fleet: KubeFleet) -> None:
    await fleet.apply()
