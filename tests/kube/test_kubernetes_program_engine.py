"""The kubernetes program with the real engine and the real Kubernetes provider plugin, against the test API
server (etcd + kube-apiserver on loopback, tests/kube/conftest.py), driven by the service's own controller
over a manifests folder.

Two limits of that server shape every test here. **No kubelet, scheduler or controller-manager runs**, so no
Pod ever starts and nothing garbage-collects: the provider's await logic (a Deployment's rollout, a Service's
endpoints) would wait until its timeout, and a foreground deletion would wait for a garbage collector that
never comes. The program therefore runs with the test-only PROXY_OPERATOR_K8S_BARE_APISERVER=1, which adds
`pulumi.com/skipAwait: "true"` and `pulumi.com/deletionPropagationPolicy: background` to every object (off by
default: tests/stacks/test_program_kubernetes.py checks the default render carries neither). What these tests
show is what the provider asks of the API server, and what the server stores; not that a proxy Pod serves.
Services are ClusterIP or NodePort: a LoadBalancer never gets an address without a cloud.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as kube_client
from kubernetes import config
from kubernetes.client import ApiClient
from typer.testing import CliRunner

from automation.queue_state import QueueState
from service.cli import app
from stacks.programs.kubernetes import BARE_APISERVER_ENV
from tests.conftest import PulumiEnv
from tests.kube.apiserver import ROOT, TOOLS_BIN, KubeApi
from tests.kube.program_fleet import ClusterObjects, KubeFleet, create_namespace, kubeconfig_for

pytestmark = pytest.mark.engine

PLUGIN = TOOLS_BIN / "pulumi-resource-kubernetes"
EXAMPLES = ROOT / "examples"


@pytest.fixture
def target(kube_client: ApiClient) -> str:
    """A namespace of its own for each test's objects (left behind: no namespace controller runs)."""
    name = f"px-{secrets.token_hex(4)}"
    create_namespace(kube_client, name)
    return name


@pytest.fixture
def fleet(
    pulumi_env: PulumiEnv, tmp_path: Path, kube_api: KubeApi, target: str, monkeypatch: pytest.MonkeyPatch
) -> KubeFleet:
    """A kubernetes entry `in-cluster` over the test API server as its admin (the ambient KUBECONFIG)."""
    if not PLUGIN.exists():
        pytest.fail(
            f"{PLUGIN} is missing: run `make kube-tools` (scripts/install-k8s-plugin.sh)", pytrace=False
        )
    monkeypatch.setenv("KUBECONFIG", str(kube_api.kubeconfig))
    monkeypatch.setenv(BARE_APISERVER_ENV, "1")
    return KubeFleet(root=tmp_path, backend_url=pulumi_env.backend_url, namespace=target)


@pytest.fixture
def objects(kube_client: ApiClient, target: str) -> ClusterObjects:
    return ClusterObjects(kube_client, target)


def condition(controller: Any, key: str, type_: str) -> Any:
    return next(c for c in controller.status.get(key).conditions if c.type == type_)


def test_up_creates_each_proxys_objects_with_the_hardened_pod_spec(
    fleet: KubeFleet, objects: ClusterObjects, target: str
) -> None:
    fleet.write_proxy("web", port=8080)
    fleet.write_proxy(
        "sock", port=1080, protocol="socks5", allowedSourceRanges=[], kubernetes={"serviceType": "NodePort"}
    )

    async def scenario() -> None:
        controller = await fleet.apply()
        assert condition(controller, "crawl/web", "Provisioned").status == "True"
        endpoint = {e.key: e for e in controller.inventory.endpoints()}["crawl/web"]
        assert (endpoint.host, endpoint.port) == (f"px-crawl-web.{target}.svc.cluster.local", 8080)

    asyncio.run(fleet.run(scenario))

    [secret] = objects.secrets("px-crawl-web")
    config = objects.secret_data(secret)["3proxy.cfg"].splitlines()
    assert config[-2:] == ["deny *", "proxy -a -n -p8080"]
    assert "allow " in "\n".join(config)
    assert "10.0.0.0/8" in "\n".join(config)

    deployment = objects.deployment("px-crawl-web")
    pod = deployment.spec.template.spec
    [container] = pod.containers
    security = container.security_context
    assert (security.run_as_non_root, security.read_only_root_filesystem) == (True, True)
    assert security.allow_privilege_escalation is False
    assert security.capabilities.drop == ["ALL"]
    assert security.seccomp_profile.type == "RuntimeDefault"
    assert pod.automount_service_account_token is False
    assert pod.security_context.run_as_non_root is True
    assert container.resources.limits == {"cpu": "500m", "memory": "128Mi"}
    assert container.readiness_probe.tcp_socket.port == 8080
    assert pod.volumes[0].secret.secret_name == secret.metadata.name
    assert deployment.metadata.labels["app.kubernetes.io/managed-by"] == "proxy-operator"

    service = objects.service("px-crawl-web")
    assert service.spec.type == "ClusterIP"
    assert service.spec.cluster_ip
    assert [(p.port, p.target_port) for p in service.spec.ports] == [(8080, 8080)]
    policy = objects.network_policy("px-crawl-web")
    assert [b.ip_block.cidr for b in policy.spec.ingress[0]._from] == ["10.0.0.0/8"]
    assert [p.port for p in policy.spec.ingress[0].ports] == [8080]

    sock = objects.service("px-crawl-sock")
    assert sock.spec.type == "NodePort"
    assert sock.spec.external_traffic_policy == "Local"
    assert sock.spec.ports[0].node_port  # allocated by the API server
    # No ranges: the policy governs egress only (issue 11), the proxy port stays open to credentials.
    assert objects.network_policy("px-crawl-sock").spec.ingress is None
    [sock_secret] = objects.secrets("px-crawl-sock")
    assert objects.secret_data(sock_secret)["3proxy.cfg"].splitlines()[-1] == "socks -n -p1080"


def test_a_port_change_replaces_only_the_secret(fleet: KubeFleet, objects: ClusterObjects) -> None:
    """The Secret holds the 3proxy configuration, which names the port: the provider replaces a Secret on
    any data change (a new auto-name, so the Deployment rolls); the Deployment, Service and NetworkPolicy
    are updated in place, keeping their identity (uid) and the Service its cluster IP."""
    fleet.write_proxy("web", port=8080)

    async def scenario() -> None:
        controller = await fleet.apply()
        before = objects.uids("px-crawl-web")
        cluster_ip = objects.service("px-crawl-web").spec.cluster_ip
        [old_secret] = objects.secrets("px-crawl-web")

        fleet.write_proxy("web", port=9090)
        await fleet.apply(controller)

        changes = controller.engine.results[-1].changes
        assert (changes.get("replace"), changes.get("update"), changes.get("delete")) == (1, 3, None)
        after = objects.uids("px-crawl-web")
        for kind in ("deployment", "service", "networkpolicy"):
            assert after[kind] == before[kind], kind
        [new_secret] = objects.secrets("px-crawl-web")
        assert new_secret.metadata.name != old_secret.metadata.name
        deployment = objects.deployment("px-crawl-web")
        assert deployment.spec.template.spec.volumes[0].secret.secret_name == new_secret.metadata.name
        assert deployment.spec.template.spec.containers[0].ports[0].container_port == 9090
        service = objects.service("px-crawl-web")
        assert service.spec.cluster_ip == cluster_ip
        assert [(p.port, p.target_port) for p in service.spec.ports] == [(9090, 9090)]
        assert objects.network_policy("px-crawl-web").spec.ingress[0].ports[0].port == 9090

    asyncio.run(fleet.run(scenario))


def test_a_removed_proxy_loses_its_objects_and_its_neighbour_keeps_them(
    fleet: KubeFleet, objects: ClusterObjects
) -> None:
    """Deletion with background propagation (see the module docstring): each object is gone once the API
    server has it deleted; a real cluster's garbage collector then removes the Deployment's ReplicaSets."""
    fleet.write_proxy("stay", port=8080)
    fleet.write_proxy("go", port=8081)

    async def scenario() -> None:
        controller = await fleet.apply()
        kept = objects.uids("px-crawl-stay")
        assert all(objects.uids("px-crawl-go").values())

        fleet.remove_proxy("go")
        await fleet.apply(controller)

        assert not objects.anything_of("px-crawl-go")
        assert objects.uids("px-crawl-stay") == kept
        assert [e.reason for e in controller.status.events("crawl/go")][-1] == "Released"

    asyncio.run(fleet.run(scenario))


def test_skip_cleanup_leaves_the_objects_in_the_cluster_and_drops_them_from_state(
    fleet: KubeFleet, objects: ClusterObjects
) -> None:
    """Then the Proxy is declared again before anyone deleted the orphans: the provider's server-side apply
    takes the Deployment, Service and NetworkPolicy (fixed names) over where they are, no collision, while
    the Secret (a generated name, with newly generated credentials) is made anew and the old one is left."""
    fleet.write_proxy("stay", port=8080)
    fleet.write_proxy("keep", port=8081)

    async def scenario() -> None:
        controller = await fleet.apply()
        left = objects.uids("px-crawl-keep")

        fleet.write_deleting("keep", skip_cleanup=True, port=8081, allowedSourceRanges=["10.0.0.0/8"])
        await fleet.apply(controller)

        assert objects.uids("px-crawl-keep") == left, "forgetting must not touch the cluster"
        urns = [r["urn"] for r in controller.engine.export("in-cluster")["deployment"]["resources"]]
        assert not [urn for urn in urns if urn.endswith("::crawl/keep") or urn.endswith("::px-crawl-keep")]
        assert [urn for urn in urns if urn.endswith("Deployment::crawl/stay")]
        assert "Forgotten" in [e.reason for e in controller.status.events("crawl/keep")]
        [orphan] = objects.secrets("px-crawl-keep")

        fleet.write_proxy("keep", port=8081)
        await fleet.apply(controller)

        adopted = objects.uids("px-crawl-keep")
        assert {k: adopted[k] for k in ("deployment", "service", "networkpolicy")} == {
            k: left[k] for k in ("deployment", "service", "networkpolicy")
        }
        [new_secret] = [s for s in objects.secrets("px-crawl-keep") if s.metadata.uid != orphan.metadata.uid]
        assert orphan.metadata.uid in (adopted["secret"] or "")  # left behind: delete it by hand
        volume = objects.deployment("px-crawl-keep").spec.template.spec.volumes[0]
        assert volume.secret.secret_name == new_secret.metadata.name

    asyncio.run(fleet.run(scenario))


def edit_target_port(api: ApiClient, namespace: str, *, manager: str) -> None:
    """What `kubectl edit service px-crawl-web` sends when someone changes the targetPort to 1234: a
    strategic merge patch under field manager `kubectl-edit` (or another tool's manager)."""
    body = {"spec": {"ports": [{"port": 8080, "targetPort": 1234}]}}
    kube_client.CoreV1Api(api).patch_namespaced_service(
        "px-crawl-web", namespace, body, field_manager=manager
    )


def test_drift_detect_reports_the_edited_service_and_changes_nothing(
    fleet: KubeFleet, objects: ClusterObjects, kube_client: ApiClient, target: str
) -> None:
    fleet.write_catalogue(["in-cluster"], driftPolicy="detect")
    fleet.write_proxy("web", port=8080)

    async def scenario() -> None:
        controller = await fleet.apply()
        edit_target_port(kube_client, target, manager="kubectl-edit")
        ups = controller.engine.up_count("in-cluster")

        controller.request_resync()
        await controller.queue.drain()

        drift = [e for e in controller.status.events("crawl/web") if e.reason == "DriftDetected"]
        assert drift
        assert "Service" in drift[0].message
        assert controller.engine.up_count("in-cluster") == ups
        assert objects.service("px-crawl-web").spec.ports[0].target_port == 1234

    asyncio.run(fleet.run(scenario))


@pytest.mark.parametrize("manager", ["kubectl-edit", "ops-script"])
def test_drift_correct_puts_the_edited_service_back(
    fleet: KubeFleet, objects: ClusterObjects, kube_client: ApiClient, target: str, manager: str
) -> None:
    """`up --refresh` after the targetPort edit. The provider takes over fields that kubectl's field managers
    own (kubectl-edit here) by itself; a field owned by any other manager ("ops-script") fails server-side
    apply with a conflict, for the whole stack, unless the apply is forced: every object of the program
    carries `pulumi.com/patchForce: "true"`, so both are put back."""
    fleet.write_catalogue(["in-cluster"], driftPolicy="correct")
    fleet.write_proxy("web", port=8080)

    async def scenario() -> None:
        controller = await fleet.apply()
        uid = objects.service("px-crawl-web").metadata.uid
        edit_target_port(kube_client, target, manager=manager)

        controller.request_resync()
        await controller.queue.drain()

        service = objects.service("px-crawl-web")
        assert service.spec.ports[0].target_port == 8080
        assert service.metadata.uid == uid, "corrected in place"
        assert manager not in {m.manager for m in service.metadata.managed_fields}
        assert controller.queue.states()["in-cluster"].state is QueueState.IDLE

    asyncio.run(fleet.run(scenario))


def narrow_user(api: ApiClient, namespace: str) -> str:
    """A ServiceAccount `deployer` in `namespace` that may manage Secrets, Services and Deployments there but
    not NetworkPolicies; returns a token for it."""
    core, rbac = kube_client.CoreV1Api(api), kube_client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "deployer"}})
    verbs = ["get", "list", "watch", "create", "update", "patch", "delete"]
    rules = [
        {"apiGroups": [""], "resources": ["secrets", "services"], "verbs": verbs},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": verbs},
    ]
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "deployer"}, "rules": rules})
    binding = {
        "metadata": {"name": "deployer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "deployer"},
        "subjects": [{"kind": "ServiceAccount", "name": "deployer", "namespace": namespace}],
    }
    rbac.create_namespaced_role_binding(namespace, binding)
    request = {"spec": {"expirationSeconds": 3600}}
    return str(core.create_namespaced_service_account_token("deployer", namespace, request).status.token)


def grant_network_policies(api: ApiClient, namespace: str) -> None:
    verbs = ["get", "list", "watch", "create", "update", "patch", "delete"]
    rule = {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": verbs}
    role = kube_client.RbacAuthorizationV1Api(api).read_namespaced_role("deployer", namespace)
    body = {"rules": [*api.sanitize_for_serialization(role.rules), rule]}
    kube_client.RbacAuthorizationV1Api(api).patch_namespaced_role("deployer", namespace, body)


def wait_until_allowed(kubeconfig: str, *, namespace: str, timeout: float = 20.0) -> None:
    """Wait until the authorizer (fed by a cache) lets the kubeconfig's user create NetworkPolicies."""
    review = kube_client.V1SelfSubjectAccessReview(
        spec=kube_client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=kube_client.V1ResourceAttributes(
                namespace=namespace, verb="create", group="networking.k8s.io", resource="networkpolicies"
            )
        )
    )
    deadline = time.monotonic() + timeout
    with config.new_client_from_config_dict(yaml.safe_load(kubeconfig)) as api:
        while (
            not kube_client.AuthorizationV1Api(api).create_self_subject_access_review(review).status.allowed
        ):
            assert time.monotonic() < deadline, "the Role's new rule never reached the authorizer"
            time.sleep(0.1)


def audit_writes(kube: KubeApi, *, offset: int, namespace: str) -> list[tuple[str, str, str]]:
    """(user, verb, resource) of each completed write in `namespace` logged after `offset` bytes."""
    with kube.audit_log.open() as log:
        log.seek(offset)
        entries = [json.loads(line) for line in log if line.strip()]
    return [
        (e["user"]["username"], e["verb"], e["objectRef"]["resource"])
        for e in entries
        if e["stage"] == "ResponseComplete"
        and e.get("objectRef", {}).get("namespace") == namespace
        and e["verb"] in ("create", "patch", "update")
    ]


def test_kubeconfig_secret_reaches_the_provider_and_a_missing_permission_is_a_permanent_error(
    fleet: KubeFleet, kube_client: ApiClient, kube_api: KubeApi, target: str
) -> None:
    """A second "cluster": the same API server through the kubeconfig of a ServiceAccount with narrower
    RBAC, named by the entry's kubeconfigSecret (a `kind: Secret` document beside the Proxies)."""
    remote_ns = f"{target}-remote"
    create_namespace(kube_client, remote_ns)
    token = narrow_user(kube_client, remote_ns)
    user = f"system:serviceaccount:{remote_ns}:deployer"
    fleet.write_entries(
        [
            {"name": "in-cluster", "type": "kubernetes", "namespace": target},
            {
                "name": "remote",
                "type": "kubernetes",
                "namespace": remote_ns,
                "kubeconfigSecret": "remote-kube",
            },
        ]
    )
    kubeconfig = kubeconfig_for(kube_api, user="deployer", token=token, namespace=remote_ns)
    fleet.write_secret("remote-kube", {"kubeconfig": kubeconfig})
    fleet.write_proxy("here", port=8080)
    fleet.write_proxy("there", provider="remote", port=8080)
    remote = ClusterObjects(kube_client, remote_ns)

    async def scenario() -> None:
        start = kube_api.audit_log.stat().st_size
        controller = await fleet.apply()

        assert condition(controller, "crawl/here", "Provisioned").status == "True"
        refused = condition(controller, "crawl/there", "Provisioned")
        assert (refused.status, refused.reason) == ("False", "CredentialsRejected")
        assert f'403 Forbidden: User "{user}"' in refused.message
        assert (
            "lacks networkpolicies.networking.k8s.io (get, list, watch, create, patch, delete)"
            in refused.message
        )
        assert controller.queue.states()["remote"].state is QueueState.FAILED  # permanent: no retry
        assert not remote.anything_of("px-crawl-there"), "refused before any object was made"
        assert not audit_writes(kube_api, offset=start, namespace=remote_ns)

        grant_network_policies(kube_client, remote_ns)
        wait_until_allowed(kubeconfig, namespace=remote_ns)
        start = kube_api.audit_log.stat().st_size
        controller.request_resync()  # a permanent failure waits for new input or the resync
        await controller.queue.drain()

        assert condition(controller, "crawl/there", "Provisioned").status == "True"
        assert all(remote.uids("px-crawl-there").values())
        writers = {
            (who, resource)
            for who, _verb, resource in audit_writes(kube_api, offset=start, namespace=remote_ns)
        }
        assert {(user, kind) for kind in ("secrets", "deployments", "services", "networkpolicies")} <= writers
        assert not [w for w in writers if w[0] != user], "only the kubeconfig's user wrote there"

    asyncio.run(fleet.run(scenario))


def test_preview_of_the_in_cluster_example_shows_the_real_plan(
    pulumi_env: PulumiEnv,
    tmp_path: Path,
    kube_api: KubeApi,
    kube_client: ApiClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`proxy-operator preview --manifests examples/in-cluster --markdown`: the provider asks the API server
    (server-side dry runs of each object whose content is known) and creates nothing. The default render:
    no test-only setting. pod-lb-1 names a Secret that is not in the folder, so it is left out and the
    preview says why."""
    if not PLUGIN.exists():
        pytest.fail(
            f"{PLUGIN} is missing: run `make kube-tools` (scripts/install-k8s-plugin.sh)", pytrace=False
        )
    monkeypatch.setenv("KUBECONFIG", str(kube_api.kubeconfig))
    monkeypatch.delenv(BARE_APISERVER_ENV, raising=False)
    create_namespace(kube_client, "proxies")  # the catalogue's namespace (deploy/namespace.yaml in a cluster)
    start = kube_api.audit_log.stat().st_size

    result = CliRunner().invoke(
        app,
        ["preview", "--manifests", str(EXAMPLES / "in-cluster"), "--markdown", "--state-dir", str(tmp_path)],
        env={"COLUMNS": "300"},
    )

    assert result.exit_code == 0, result.output
    assert "| `in-cluster` | up | 1 | 0 | 0 | 0 | changes |" in result.stdout
    assert "| `crawl/pod-1` | create |" in result.stdout
    assert "skipped `crawl/pod-lb-1`: Secret crawl/crawler-proxy-credentials" in result.stdout
    dry_runs = dry_run_writes(kube_api, offset=start, namespace="proxies")
    # The Secret's content waits for the generated credentials (made by the first `up`), so the provider
    # previews it on its own; the objects whose content is known are dry-run by the API server.
    assert {"deployments", "services", "networkpolicies"} <= dry_runs
    assert not ClusterObjects(kube_client, "proxies").anything_of("px-crawl-pod-1")


def dry_run_writes(kube: KubeApi, *, offset: int, namespace: str) -> set[str]:
    """Resources the provider dry-ran a write of in `namespace` after `offset` bytes of the audit log."""
    with kube.audit_log.open() as log:
        log.seek(offset)
        entries = [json.loads(line) for line in log if line.strip()]
    return {
        e["objectRef"]["resource"]
        for e in entries
        if e["stage"] == "ResponseComplete"
        and "dryRun=All" in e["requestURI"]
        and e.get("objectRef", {}).get("namespace") == namespace
    }
