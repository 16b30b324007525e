"""The kubernetes program with the real engine and the real Kubernetes provider plugin, against the test node
(tests/kube/node.py: a single-node cluster with its kubelet, controller-manager and scheduler), driven by the
service's own controller over a manifests folder (fixtures `node_fleet`, `node_objects` in conftest.py).

The proxies run the forward proxy from the service's own image (`operator_image`, imported into the node).
The provider awaits as it does by default: an `up` returns once each Deployment's rollout is complete (its pod
Ready) and each Service has endpoints, and it deletes in the foreground, so a removal returns once the pods
are gone. Services are ClusterIP or NodePort: a LoadBalancer never gets an address without a cloud. The
preview test needs no pod: it runs on the tests' bare API server (etcd + kube-apiserver, `kube_api`).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Iterator
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
from stacks.forward_proxy.config import ProxyConfig
from stacks.programs.kubernetes import CONFIG_DIR, CONFIG_KEY, DAEMON, READINESS_PERIOD_SECONDS
from tests.conftest import PulumiEnv
from tests.kube.apiserver import ROOT, TOOLS_BIN, KubeApi
from tests.kube.node import KubeNode
from tests.kube.pods import create_namespace, delete_namespace
from tests.kube.program_fleet import ClusterObjects, KubeFleet, kubeconfig_for
from tests.kube.program_fleet import create_namespace as ensure_namespace

pytestmark = pytest.mark.engine

PLUGIN = TOOLS_BIN / "pulumi-resource-kubernetes"
EXAMPLES = ROOT / "examples"
on_node = pytest.mark.node


def condition(controller: Any, key: str, type_: str) -> Any:
    return next(c for c in controller.status.get(key).conditions if c.type == type_)


def proxy_config(objects: ClusterObjects, name: str) -> ProxyConfig:
    """The forward proxy's configuration in the proxy's (only) Secret, as the pod's daemon reads it."""
    [secret] = objects.secrets(name)
    return ProxyConfig.parse(objects.secret_data(secret)[CONFIG_KEY].encode())


def running(objects: ClusterObjects, name: str) -> list[Any]:
    """The Deployment `name`'s pods that are Ready and not terminating."""
    labels = objects.deployment(name).spec.selector.match_labels
    return [
        pod
        for pod in objects.pods(labels)
        if pod.metadata.deletion_timestamp is None
        and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
    ]


def rolled_out(objects: ClusterObjects, name: str) -> bool:
    """The Deployment's current template is what runs: observed, updated and Ready, one replica."""
    deployment = objects.deployment(name)
    status = deployment.status
    return (status.observed_generation, status.updated_replicas, status.ready_replicas) == (
        deployment.metadata.generation,
        1,
        1,
    )


GARBAGE_COLLECTOR = "generic-garbage-collector"


def deployment_writers(log: Path, *, offset: int) -> set[tuple[str, str]]:
    """(user, Deployment name) of each completed patch or update of a Deployment (not its status) logged
    after `offset` bytes of the audit log."""
    with log.open() as lines:
        lines.seek(offset)
        entries = [json.loads(line) for line in lines if line.strip()]
    return {
        (e["user"]["username"], e["objectRef"].get("name", ""))
        for e in entries
        if e["stage"] == "ResponseComplete"
        and e.get("objectRef", {}).get("resource") == "deployments"
        and not e["objectRef"].get("subresource")
        and e["verb"] in ("patch", "update")
    }


@on_node
def test_up_creates_each_proxys_objects_with_the_hardened_pod_spec_and_its_pod_is_ready(
    node_fleet: KubeFleet, node_objects: ClusterObjects, node_target: str, operator_image: str
) -> None:
    objects = node_objects
    node_fleet.write_proxy("web", port=8080)
    node_fleet.write_proxy(
        "sock", port=1080, protocol="socks5", allowedSourceRanges=[], kubernetes={"serviceType": "NodePort"}
    )

    async def scenario() -> None:
        controller = await node_fleet.apply()
        # The await: the `up` returned once the rollout was complete, so the pod is Ready now.
        for name in ("px-crawl-web", "px-crawl-sock"):
            assert objects.deployment(name).status.ready_replicas == 1, name
        assert condition(controller, "crawl/web", "Provisioned").status == "True"
        endpoint = {e.key: e for e in controller.inventory.endpoints()}["crawl/web"]
        assert (endpoint.host, endpoint.port) == (f"px-crawl-web.{node_target}.svc.cluster.local", 8080)

    asyncio.run(node_fleet.run(scenario))

    web = proxy_config(objects, "px-crawl-web")
    assert (web.bind, web.port, web.protocol, web.sources) == ("0.0.0.0", 8080, "http", ("10.0.0.0/8",))
    assert web.username
    assert web.password
    assert (
        web.control is None
    )  # the service runs outside the cluster here: it cannot reach a pod's control port
    [secret] = objects.secrets("px-crawl-web")
    assert objects.secret_data(secret)["username"] == web.username

    deployment = objects.deployment("px-crawl-web")
    pod = deployment.spec.template.spec
    [container] = pod.containers
    assert (container.image, container.command) == (operator_image, [DAEMON, f"{CONFIG_DIR}/{CONFIG_KEY}"])
    assert container.volume_mounts[0].mount_path == CONFIG_DIR
    security = container.security_context
    assert (security.run_as_non_root, security.read_only_root_filesystem) == (True, True)
    assert security.allow_privilege_escalation is False
    assert security.capabilities.drop == ["ALL"]
    assert security.seccomp_profile.type == "RuntimeDefault"
    assert pod.automount_service_account_token is False
    assert pod.security_context.run_as_non_root is True
    assert container.resources.limits == {"cpu": "500m", "memory": "128Mi"}
    assert container.readiness_probe.tcp_socket.port == 8080
    assert container.readiness_probe.period_seconds == READINESS_PERIOD_SECONDS  # Ready within ~2 s
    assert [(p.name, p.container_port) for p in container.ports] == [("proxy", 8080)]
    assert pod.volumes[0].secret.secret_name == secret.metadata.name
    assert deployment.metadata.labels["app.kubernetes.io/managed-by"] == "proxy-operator"
    [web_pod] = running(objects, "px-crawl-web")
    assert web_pod.spec.containers[0].image == operator_image

    service = objects.service("px-crawl-web")
    assert service.spec.type == "ClusterIP"
    assert service.spec.cluster_ip
    assert [(p.port, p.target_port) for p in service.spec.ports] == [(8080, "proxy")]
    policy = objects.network_policy("px-crawl-web")
    assert [b.ip_block.cidr for b in policy.spec.ingress[0]._from] == ["10.0.0.0/8"]
    assert [p.port for p in policy.spec.ingress[0].ports] == [
        "proxy"
    ]  # by name: each pod's own port during a rollout

    sock = objects.service("px-crawl-sock")
    assert sock.spec.type == "NodePort"
    assert sock.spec.external_traffic_policy == "Local"
    assert sock.spec.ports[0].node_port  # allocated by the API server
    # No ranges: the policy governs egress only (issue 11), the proxy port stays open to credentials.
    assert objects.network_policy("px-crawl-sock").spec.ingress is None
    socks = proxy_config(objects, "px-crawl-sock")
    assert (socks.port, socks.protocol, socks.sources) == (1080, "socks5", ())


@on_node
def test_a_port_change_replaces_only_the_secret_and_rolls_the_pod(
    node_fleet: KubeFleet, node_objects: ClusterObjects
) -> None:
    """The Secret holds the forward proxy's configuration, which names the port: the provider replaces a
    Secret on any data change (a new auto-name, so the Deployment rolls); the Deployment and Service are
    updated in place, keeping their identity (uid) and the Service its cluster IP; the NetworkPolicy, which
    names the port, does not change. The
    `up` returns once the new pod is Ready and the old one is on its way out."""
    objects = node_objects
    node_fleet.write_proxy("web", port=8080)

    async def scenario() -> None:
        controller = await node_fleet.apply()
        before = objects.uids("px-crawl-web")
        cluster_ip = objects.service("px-crawl-web").spec.cluster_ip
        [old_secret] = objects.secrets("px-crawl-web")
        [old_pod] = running(objects, "px-crawl-web")

        node_fleet.write_proxy("web", port=9090)
        await node_fleet.apply(controller)

        assert rolled_out(objects, "px-crawl-web"), objects.deployment("px-crawl-web").status
        [new_pod] = running(objects, "px-crawl-web")
        assert new_pod.metadata.uid != old_pod.metadata.uid
        assert new_pod.spec.containers[0].ports[0].container_port == 9090
        changes = controller.engine.results[-1].changes
        # The NetworkPolicy names its port, so a port change leaves it as it is.
        assert (changes.get("replace"), changes.get("update"), changes.get("delete")) == (1, 2, None)
        after = objects.uids("px-crawl-web")
        for kind in ("deployment", "service", "networkpolicy"):
            assert after[kind] == before[kind], kind
        [new_secret] = objects.secrets("px-crawl-web")
        assert new_secret.metadata.name != old_secret.metadata.name
        assert proxy_config(objects, "px-crawl-web").port == 9090
        deployment = objects.deployment("px-crawl-web")
        assert deployment.spec.template.spec.volumes[0].secret.secret_name == new_secret.metadata.name
        assert deployment.spec.template.spec.containers[0].ports[0].container_port == 9090
        service = objects.service("px-crawl-web")
        assert service.spec.cluster_ip == cluster_ip
        assert [(p.port, p.target_port) for p in service.spec.ports] == [(9090, "proxy")]
        assert (
            objects.network_policy("px-crawl-web").spec.ingress[0].ports[0].port == "proxy"
        )  # by name: unchanged by the port change

    asyncio.run(node_fleet.run(scenario))


@on_node
def test_a_removed_proxy_loses_its_pods_and_a_forgotten_one_keeps_them_and_is_adopted_again(
    node_fleet: KubeFleet, node_objects: ClusterObjects, kube_node: KubeNode
) -> None:
    """One stack, three proxies, three declared changes, each checked on the cluster and in the state.

    Removal, in the foreground: the provider's delete returns once the garbage collector removed the
    Deployment's ReplicaSet and its pod, so after the `up` no pod with the proxy's labels is left, not even
    a terminating one. That alone would hold with a background deletion too (the `up` goes on deleting the
    Secret and NetworkPolicy meanwhile): the audit log shows the foreground, the garbage collector taking
    its `foregroundDeletion` finalizer off the Deployment once the dependents were gone.

    skip-cleanup: the objects and the pod stay in the cluster and leave the state. Then the Proxy is
    declared again before anyone deleted the orphans: the provider's server-side apply takes the
    Deployment, Service and NetworkPolicy (fixed names) over where they are, no collision, while the Secret
    (a generated name, with newly generated credentials) is made anew and the old one is left.

    The neighbour ("stay") keeps its objects and its pod through all of it."""
    objects = node_objects
    for name, port in (("stay", 8080), ("go", 8081), ("keep", 8082)):
        node_fleet.write_proxy(name, port=port)

    async def scenario() -> None:
        controller = await node_fleet.apply()
        kept = objects.uids("px-crawl-stay")
        [staying] = running(objects, "px-crawl-stay")
        assert all(objects.uids("px-crawl-go").values())
        labels = objects.deployment("px-crawl-go").spec.selector.match_labels
        assert len(running(objects, "px-crawl-go")) == 1
        left = objects.uids("px-crawl-keep")
        [keeping] = running(objects, "px-crawl-keep")

        node_fleet.remove_proxy("go")
        start = kube_node.files.audit_log.stat().st_size
        await node_fleet.apply(controller)

        assert not objects.anything_of("px-crawl-go")
        assert objects.pods(labels) == []
        collector = f"system:serviceaccount:kube-system:{GARBAGE_COLLECTOR}"
        assert (collector, "px-crawl-go") in deployment_writers(kube_node.files.audit_log, offset=start)
        assert [e.reason for e in controller.status.events("crawl/go")][-1] == "Released"

        node_fleet.write_deleting("keep", skip_cleanup=True, port=8082, allowedSourceRanges=["10.0.0.0/8"])
        await node_fleet.apply(controller)

        assert objects.uids("px-crawl-keep") == left, "forgetting must not touch the cluster"
        assert [p.metadata.uid for p in running(objects, "px-crawl-keep")] == [keeping.metadata.uid]
        urns = [r["urn"] for r in controller.engine.export("in-cluster")["deployment"]["resources"]]
        assert not [urn for urn in urns if urn.endswith("::crawl/keep") or urn.endswith("::px-crawl-keep")]
        assert [urn for urn in urns if urn.endswith("Deployment::crawl/stay")]
        assert "Forgotten" in [e.reason for e in controller.status.events("crawl/keep")]
        [orphan] = objects.secrets("px-crawl-keep")

        node_fleet.write_proxy("keep", port=8082)
        await node_fleet.apply(controller)

        adopted = objects.uids("px-crawl-keep")
        assert {k: adopted[k] for k in ("deployment", "service", "networkpolicy")} == {
            k: left[k] for k in ("deployment", "service", "networkpolicy")
        }
        [new_secret] = [s for s in objects.secrets("px-crawl-keep") if s.metadata.uid != orphan.metadata.uid]
        assert orphan.metadata.uid in (adopted["secret"] or "")  # left behind: delete it by hand
        volume = objects.deployment("px-crawl-keep").spec.template.spec.volumes[0]
        assert volume.secret.secret_name == new_secret.metadata.name
        assert rolled_out(objects, "px-crawl-keep"), "the new Secret rolled the adopted Deployment"

        assert objects.uids("px-crawl-stay") == kept
        assert [p.metadata.uid for p in running(objects, "px-crawl-stay")] == [staying.metadata.uid]

    asyncio.run(node_fleet.run(scenario))


def edit_target_port(api: ApiClient, namespace: str, *, manager: str) -> None:
    """What `kubectl edit service px-crawl-web` sends when someone changes the targetPort to 1234: a
    strategic merge patch under field manager `kubectl-edit` (or another tool's manager)."""
    body = {"spec": {"ports": [{"port": 8080, "targetPort": 1234}]}}
    kube_client.CoreV1Api(api).patch_namespaced_service(
        "px-crawl-web", namespace, body, field_manager=manager
    )


@on_node
def test_drift_detect_reports_the_edited_service_and_changes_nothing(
    node_fleet: KubeFleet, node_objects: ClusterObjects, node_api: ApiClient, node_target: str
) -> None:
    node_fleet.write_catalogue(["in-cluster"], driftPolicy="detect")
    node_fleet.write_proxy("web", port=8080)

    async def scenario() -> None:
        controller = await node_fleet.apply()
        edit_target_port(node_api, node_target, manager="kubectl-edit")
        ups = controller.engine.up_count("in-cluster")

        controller.request_resync()
        await controller.queue.drain()

        drift = [e for e in controller.status.events("crawl/web") if e.reason == "DriftDetected"]
        assert drift
        assert "Service" in drift[0].message
        assert controller.engine.up_count("in-cluster") == ups
        assert node_objects.service("px-crawl-web").spec.ports[0].target_port == 1234

    asyncio.run(node_fleet.run(scenario))


@on_node
def test_drift_correct_puts_the_edited_service_back(
    node_fleet: KubeFleet, node_objects: ClusterObjects, node_api: ApiClient, node_target: str
) -> None:
    """`up --refresh` after a targetPort edit, once by each kind of manager (one stack, two drifts). The
    provider takes over fields that kubectl's field managers own (kubectl-edit) by itself; a field owned by
    any other manager ("ops-script") fails server-side apply with a conflict, for the whole stack, unless
    the apply is forced: every object of the program carries `pulumi.com/patchForce: "true"`, so both are
    put back."""
    node_fleet.write_catalogue(["in-cluster"], driftPolicy="correct")
    node_fleet.write_proxy("web", port=8080)

    async def scenario() -> None:
        controller = await node_fleet.apply()
        uid = node_objects.service("px-crawl-web").metadata.uid
        for manager in ("kubectl-edit", "ops-script"):
            edit_target_port(node_api, node_target, manager=manager)
            assert node_objects.service("px-crawl-web").spec.ports[0].target_port == 1234, manager

            controller.request_resync()
            await controller.queue.drain()

            service = node_objects.service("px-crawl-web")
            assert service.spec.ports[0].target_port == "proxy", manager
            assert service.metadata.uid == uid, f"corrected in place ({manager})"
            assert manager not in {m.manager for m in service.metadata.managed_fields}
            assert controller.queue.states()["in-cluster"].state is QueueState.IDLE, manager

    asyncio.run(node_fleet.run(scenario))


ROLE = "proxy-operator-workloads"


def workloads_rules() -> list[dict[str, Any]]:
    """The rules of the Role proxy-operator-workloads in deploy/rbac.yaml, what the service's user holds in
    a namespace of proxies, without its networkpolicies rule."""
    documents = yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text())
    [role] = [d for d in documents if d and (d["kind"], d["metadata"]["name"]) == ("Role", ROLE)]
    rules = [r for r in role["rules"] if "networkpolicies" not in r["resources"]]
    assert len(rules) == len(role["rules"]) - 1, role["rules"]
    return rules


def narrow_user(api: ApiClient, namespace: str) -> str:
    """A ServiceAccount `deployer` in `namespace` holding deploy/rbac.yaml's workloads Role but for its
    NetworkPolicies rule (`workloads_rules`); returns a token for it."""
    core, rbac = kube_client.CoreV1Api(api), kube_client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "deployer"}})
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "deployer"}, "rules": workloads_rules()})
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


PROGRAM_KINDS = ("secrets", "deployments", "services", "networkpolicies")


def audit_writes(log: Path, *, offset: int, namespace: str) -> list[tuple[str, str, str]]:
    """(user, verb, resource) of each completed write of an object of the program's kinds in `namespace`
    logged after `offset` bytes. The node's controllers write there too (ReplicaSets, Pods, EndpointSlices,
    a Deployment's status subresource): not the program's objects, left out."""
    with log.open() as lines:
        lines.seek(offset)
        entries = [json.loads(line) for line in lines if line.strip()]
    return [
        (e["user"]["username"], e["verb"], e["objectRef"]["resource"])
        for e in entries
        if e["stage"] == "ResponseComplete"
        and e.get("objectRef", {}).get("namespace") == namespace
        and e["objectRef"].get("resource") in PROGRAM_KINDS
        and not e["objectRef"].get("subresource")
        and e["verb"] in ("create", "patch", "update")
    ]


@pytest.fixture
def remote_ns(node_api: ApiClient, node_target: str) -> Iterator[str]:
    """A second namespace on the node, for the entry reached through a kubeconfig Secret."""
    core = kube_client.CoreV1Api(node_api)
    name = f"{node_target}-remote"
    create_namespace(core, name)
    yield name
    delete_namespace(core, name)


@on_node
def test_kubeconfig_secret_reaches_the_provider_and_a_missing_permission_is_a_permanent_error(
    node_fleet: KubeFleet, node_api: ApiClient, kube_node: KubeNode, node_target: str, remote_ns: str
) -> None:
    """A second "cluster": the same API server through the kubeconfig of a ServiceAccount with narrower
    RBAC, named by the entry's kubeconfigSecret (a `kind: Secret` document beside the Proxies). Who wrote
    what is read from the node's audit log (tests/kube/node_config.py)."""
    audit_log = kube_node.files.audit_log
    token = narrow_user(node_api, remote_ns)
    user = f"system:serviceaccount:{remote_ns}:deployer"
    node_fleet.write_entries(
        [
            {"name": "in-cluster", "type": "kubernetes", "namespace": node_target},
            {
                "name": "remote",
                "type": "kubernetes",
                "namespace": remote_ns,
                "kubeconfigSecret": "remote-kube",
            },
        ]
    )
    kubeconfig = kubeconfig_for(
        url=kube_node.url, ca_file=kube_node.files.ca_file, user="deployer", token=token, namespace=remote_ns
    )
    node_fleet.write_secret("remote-kube", {"kubeconfig": kubeconfig})
    node_fleet.write_proxy("here", port=8080)
    node_fleet.write_proxy("there", provider="remote", port=8080)
    remote = ClusterObjects(node_api, remote_ns)

    async def scenario() -> None:
        start = audit_log.stat().st_size
        controller = await node_fleet.apply()

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
        assert not audit_writes(audit_log, offset=start, namespace=remote_ns)

        grant_network_policies(node_api, remote_ns)
        wait_until_allowed(kubeconfig, namespace=remote_ns)
        start = audit_log.stat().st_size
        controller.request_resync()  # a permanent failure waits for new input or the resync
        await controller.queue.drain()

        assert condition(controller, "crawl/there", "Provisioned").status == "True"
        assert all(remote.uids("px-crawl-there").values())
        assert remote.deployment("px-crawl-there").status.ready_replicas == 1  # awaited as that user
        writes = audit_writes(audit_log, offset=start, namespace=remote_ns)
        writers = {(who, resource) for who, _verb, resource in writes}
        assert {(user, kind) for kind in PROGRAM_KINDS} <= writers
        assert not [w for w in writers if w[0] != user], "only the kubeconfig's user wrote there"

    asyncio.run(node_fleet.run(scenario))
    # The plugin wrote the kubeconfig to its TMPDIR at each start: the operation's own folder, removed with
    # it, not the system's (automation/engine/core.py `_operation`; docs/security.md).
    left = [
        path
        for path in Path(tempfile.gettempdir()).glob("kubeconfig*")
        if token in path.read_text(errors="replace")
    ]
    assert not left, f"the kubeconfig Secret's content was left in the temporary folder: {left}"


def test_preview_of_the_in_cluster_example_shows_the_real_plan(
    pulumi_env: PulumiEnv,
    tmp_path: Path,
    kube_api: KubeApi,
    kube_client: ApiClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`proxy-operator preview --manifests examples/in-cluster --markdown`: the provider asks the API server
    (server-side dry runs of each object whose content is known) and creates nothing; no pod is involved, so
    this runs on the bare API server. pod-lb-1 names a Secret that is not in the folder, so it is left out
    and the preview says why."""
    if not PLUGIN.exists():
        pytest.fail(
            f"{PLUGIN} is missing: run `make kube-tools` (scripts/install-k8s-plugin.sh)", pytrace=False
        )
    monkeypatch.setenv("KUBECONFIG", str(kube_api.kubeconfig))
    ensure_namespace(kube_client, "proxies")  # the catalogue's namespace (deploy/namespace.yaml in a cluster)
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
    dry_runs = dry_run_writes(kube_api.audit_log, offset=start, namespace="proxies")
    # The Secret's content waits for the generated credentials (made by the first `up`), so the provider
    # previews it on its own; the objects whose content is known are dry-run by the API server.
    assert {"deployments", "services", "networkpolicies"} <= dry_runs
    assert not ClusterObjects(kube_client, "proxies").anything_of("px-crawl-pod-1")


def dry_run_writes(log: Path, *, offset: int, namespace: str) -> set[str]:
    """Resources the provider dry-ran a write of in `namespace` after `offset` bytes of the audit log."""
    with log.open() as lines:
        lines.seek(offset)
        entries = [json.loads(line) for line in lines if line.strip()]
    return {
        e["objectRef"]["resource"]
        for e in entries
        if e["stage"] == "ResponseComplete"
        and "dryRun=All" in e["requestURI"]
        and e.get("objectRef", {}).get("namespace") == namespace
    }
