"""`proxy-operator orphans` on a kubernetes entry, against the test node (tests/kube/node.py) with the real
engine and the real Kubernetes provider plugin (fixtures `node_fleet`, `node_objects` in conftest.py).

One proxy is applied; then two Deployments are made by hand with our labels and no stack holding them: one
with this installation's id, one with another's; both run a pod (the node's busybox). `orphans` lists only
the first (not the stack's objects, not the other installation's), and `--delete --yes` removes it and
nothing else; its pod follows (a background deletion: the node's garbage collector removes it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from kubernetes import client as kube_client
from kubernetes.client import ApiClient
from typer.testing import CliRunner

from service.cli import app
from service.cli_orphans import find_orphans
from stacks.marks import K8S_INSTALLATION
from tests.kube.images import BUSYBOX_IMAGE
from tests.kube.program_fleet import ClusterObjects, KubeFleet

pytestmark = [pytest.mark.engine, pytest.mark.node]
GONE_WITHIN = 60.0


def _stray(api: ApiClient, namespace: str, name: str, installation: str) -> dict[str, str]:
    """A Deployment `name` with our labels, running one pod; its selector."""
    labels = {
        "app.kubernetes.io/managed-by": "proxy-operator",
        K8S_INSTALLATION: installation,
        "app.kubernetes.io/instance": name,
    }
    container = {
        "name": "proxy",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sleep", "3600"],
    }
    pod = {
        "metadata": {"labels": labels},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 1},
    }
    selector = {"app.kubernetes.io/instance": name}
    body = {
        "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": selector}, "template": pod},
    }
    kube_client.AppsV1Api(api).create_namespaced_deployment(namespace, body)
    return selector


def wait_for(check: Callable[[], object], *, what: str, timeout: float = GONE_WITHIN) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} not within {timeout:.0f} s"
        time.sleep(0.5)


def test_orphans_lists_only_this_installations_unheld_objects_and_deletes_them(
    node_fleet: KubeFleet, node_objects: ClusterObjects, node_api: ApiClient, node_target: str
) -> None:
    fleet, objects = node_fleet, node_objects
    fleet.write_proxy("web", port=8080)
    asyncio.run(fleet.run(lambda: _apply(fleet)))
    settings = fleet.settings()
    installation = settings.installation_name()
    web = objects.deployment("px-crawl-web")
    assert web.metadata.labels[K8S_INSTALLATION] == installation
    assert K8S_INSTALLATION not in web.spec.template.metadata.labels  # no rollout when it was added
    assert find_orphans(settings, fleet.manifests) == []  # the stack holds all four of its objects

    stray = _stray(node_api, node_target, "px-stray", installation)
    foreign = _stray(node_api, node_target, "px-foreign", "another-installation")
    wait_for(lambda: objects.pods(stray) and objects.pods(foreign), what="the strays' pods")

    [orphan] = find_orphans(settings, fleet.manifests)
    assert (orphan.provider, orphan.kind) == ("in-cluster", "Deployment")
    assert orphan.id == f"{node_target}/px-stray"

    args = ["orphans", "--manifests", str(fleet.manifests), "--state-dir", str(settings.state_dir)]
    refused = CliRunner().invoke(app, [*args, "--delete"], input="n\n")
    assert refused.exit_code == 1, refused.output
    assert objects.deployment("px-stray") is not None
    result = CliRunner().invoke(app, [*args, "--delete", "--yes"])
    assert result.exit_code == 0, result.output
    assert f"in-cluster\tDeployment\t{node_target}/px-stray" in result.output
    assert "deleted 1 orphan(s)" in result.output
    assert objects.deployment("px-stray") is None
    wait_for(lambda: not objects.pods(stray), what="the garbage collector removing the orphan's pod")
    assert objects.deployment("px-foreign") is not None  # another installation's: not ours to judge
    assert objects.pods(foreign)
    assert objects.deployment("px-crawl-web") is not None
    assert objects.service("px-crawl-web") is not None
    assert objects.deployment("px-crawl-web").status.ready_replicas == 1


async def _apply(fleet: KubeFleet) -> None:
    await fleet.apply()
