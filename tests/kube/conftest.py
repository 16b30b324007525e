"""Fixtures of the tests against a real Kubernetes API server (etcd + kube-apiserver on loopback) and of the
tests against the single-node cluster (tests/kube/node.py).

`kube_api` starts both once per session, installs every CRD in crds/ and hands out a `KubeApi` (its
`kubeconfig` is a file path); `kube_client` is a ready `kubernetes` ApiClient and `dynamic` a dynamic client
on it. `kube_node` starts the node once per session, `operator_image` imports the service's image into it;
`node_api`, `node_target` (a namespace of the test's own, deleted after it), `node_fleet` (the real engine
and Kubernetes plugin driven over a manifests folder, as the node's admin) and `node_objects` are what a test
of the kubernetes program on the node uses. When a part is missing or does not start, the tests that use
them fail (not skip) with what to do: a missing apiserver is a broken install.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from kubernetes.client import ApiClient, CoreV1Api
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import DynamicApiError

from stacks.models import DEFAULT_KUBERNETES_IMAGE
from tests.conftest import PulumiEnv
from tests.kube.apiserver import ROOT, TOOLS_BIN, ApiServerUnavailable, KubeApi, running_apiserver
from tests.kube.manifests import dynamic_client, install_crds, refusal
from tests.kube.node import KubeNode, NodeUnavailable, running_node
from tests.kube.operator_image import ImageBuildFailed, build_archive
from tests.kube.pods import create_namespace, delete_namespace
from tests.kube.program_fleet import ClusterObjects, KubeFleet

CRDS = ROOT / "crds"
K8S_PLUGIN = TOOLS_BIN / "pulumi-resource-kubernetes"


@pytest.fixture(scope="session")
def kube_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApi]:
    """etcd + kube-apiserver for the whole session, with the project's CRDs installed."""
    workdir = tmp_path_factory.mktemp("kube")
    with ExitStack() as stack:
        failure = ""
        try:
            api = stack.enter_context(running_apiserver(workdir))
            with api.client() as client:
                install_crds(client, CRDS, cache_dir=workdir)
        except ApiServerUnavailable as exc:
            failure = f"the test API server cannot start: {exc}"
        except DynamicApiError as exc:
            failure = f"the apiserver refuses a CRD in crds/: {refusal(exc)}"
        if failure:
            pytest.fail(failure, pytrace=False)
        yield api


@pytest.fixture(scope="session")
def kube_client(kube_api: KubeApi) -> Iterator[ApiClient]:
    """A `kubernetes` ApiClient logged in as the apiserver's admin (system:masters)."""
    with kube_api.client() as client:
        yield client


@pytest.fixture(scope="session")
def dynamic(kube_client: ApiClient, tmp_path_factory: pytest.TempPathFactory) -> DynamicClient:
    """A `kubernetes.dynamic` client on `kube_client`, its discovery cache in a temporary folder."""
    return dynamic_client(kube_client, tmp_path_factory.mktemp("discovery"))


@pytest.fixture(scope="session")
def kube_node(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[KubeNode]:
    """A whole single-node cluster (tests/kube/node.py), started once for the session on first use (the
    tests marked `node`). It fails (never skips) when a part cannot start."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")

    def say(line: str) -> None:
        with capture.global_and_fixture_disabled():
            print(f"\n[kube-node] {line}", end="", flush=True)

    workdir = tmp_path_factory.mktemp("node", numbered=True)
    failure = ""
    with ExitStack() as stack:
        try:
            node = stack.enter_context(running_node(workdir, say=say))
        except NodeUnavailable as exc:
            failure = str(exc)
        if failure:
            pytest.fail(failure, pytrace=False)
        yield node


@pytest.fixture(scope="session")
def operator_image(kube_node: KubeNode, pytestconfig: pytest.Config) -> str:
    """The service's image from this checkout (`make image`, tests/kube/operator_image.py), imported into
    the test node under the name deploy/ and the kubernetes program use; that name. Fails, never skips."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")

    def say(line: str) -> None:
        with capture.global_and_fixture_disabled():
            print(f"\n[image] {line}", end="", flush=True)

    failure = ""
    try:
        kube_node.load_image(build_archive(say=say), name=DEFAULT_KUBERNETES_IMAGE)
    except (ImageBuildFailed, NodeUnavailable, subprocess.TimeoutExpired) as exc:
        failure = f"the service image cannot be built or loaded into the test node: {exc}"
    if failure:
        pytest.fail(failure, pytrace=False)
    return DEFAULT_KUBERNETES_IMAGE


@pytest.fixture
def node_api(kube_node: KubeNode) -> Iterator[ApiClient]:
    """A `kubernetes` ApiClient logged in as the node's admin (system:masters)."""
    with kube_node.client() as client:
        yield client


@pytest.fixture
def node_target(node_api: ApiClient) -> Iterator[str]:
    """A namespace of the test's own on the node, pods allowed in it; deleted after the test."""
    core = CoreV1Api(node_api)
    name = f"px-{secrets.token_hex(4)}"
    create_namespace(core, name)
    yield name
    delete_namespace(core, name)


@pytest.fixture
def node_fleet(
    pulumi_env: PulumiEnv,
    tmp_path: Path,
    kube_node: KubeNode,
    operator_image: str,
    node_target: str,
    monkeypatch: pytest.MonkeyPatch,
) -> KubeFleet:
    """A kubernetes entry `in-cluster` over the test node's API server as its admin (the ambient
    KUBECONFIG), putting the proxies in `node_target`; the proxies' image is the default, the service's own,
    imported into the node."""
    if not K8S_PLUGIN.exists():
        pytest.fail(
            f"{K8S_PLUGIN} is missing: run `make kube-tools` (scripts/install-k8s-plugin.sh)", pytrace=False
        )
    monkeypatch.setenv("KUBECONFIG", str(kube_node.kubeconfig))
    return KubeFleet(root=tmp_path, backend_url=pulumi_env.backend_url, namespace=node_target)


@pytest.fixture
def node_objects(node_api: ApiClient, node_target: str) -> ClusterObjects:
    """What the program made in `node_target`, read as the node's admin."""
    return ClusterObjects(node_api, node_target)
