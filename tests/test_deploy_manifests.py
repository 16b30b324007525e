"""Offline checks of the cluster manifests (deploy/, crds/) and of the docs that describe the settings.

These load every YAML document and check the invariants a reviewer would check by eye -- the pod runs
non-root on a read-only root filesystem with writable emptyDirs, in the in-cluster mode (no --manifests, the
catalogue ConfigMap read through the API) with two replicas under leader election, RBAC grants what the
Kubernetes source needs, every Secret and ConfigMap the Deployment names has a sample, every PROXY_OPERATOR_*
variable is a real setting, and docs/operations.md lists every setting. tests/kube applies them to a real
API server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.auth import parse_tokens
from service.config import OperatorSettings
from service.kube.settings import KubeSettings
from service.settings import DiscoverySettings, HealthSettings
from service.ui.settings import UiSettings
from stacks.catalogue import parse_catalogue

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CRD = ROOT / "crds" / "crawl.example.com_proxies.yaml"
# Read by the Pulumi program in the child process (stacks/__main__.py), not by the settings.
PROGRAM_ENV = {"PROXY_OPERATOR_KVM_SSH_DIR"}


def yaml_files() -> list[Path]:
    return sorted([*DEPLOY.rglob("*.yaml"), *(ROOT / "crds").rglob("*.yaml")])


def documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in yaml_files():
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc is not None:
                yield path, doc


def objects(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in documents() if doc.get("kind") == kind]


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [doc for doc in objects(kind) if name is None or doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec() -> dict[str, Any]:
    return one("Deployment")["spec"]["template"]["spec"]


def container() -> dict[str, Any]:
    containers = pod_spec()["containers"]
    assert len(containers) == 1
    return containers[0]


def arg(name: str) -> str:
    prefix = f"--{name}="
    values = [a.removeprefix(prefix) for a in container()["args"] if a.startswith(prefix)]
    assert values, f"the container passes no {prefix}"
    return values[0]


# --- every document ---------------------------------------------------------------------------------


def test_the_crd_and_the_deploy_files_exist() -> None:
    assert CRD.is_file()
    for name in ("namespace", "serviceaccount", "rbac", "deployment", "service"):
        assert (DEPLOY / f"{name}.yaml").is_file(), name
    assert (DEPLOY / "README.md").is_file()
    assert len(list((DEPLOY / "config-samples").glob("*.yaml"))) >= 3


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_document_names_its_api_kind_and_name(path: Path) -> None:
    docs = [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]
    assert docs, f"{path} holds no document"
    for doc in docs:
        assert isinstance(doc, dict), f"{path}: a document is not a mapping"
        assert doc.get("apiVersion"), f"{path}: apiVersion missing"
        assert doc.get("kind"), f"{path}: kind missing"
        assert (doc.get("metadata") or {}).get("name"), f"{path}: metadata.name missing in a {doc['kind']}"


def test_namespaced_objects_live_in_a_namespace_that_is_created() -> None:
    namespaces = {ns["metadata"]["name"] for ns in objects("Namespace")}
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
    for path, doc in documents():
        if doc["kind"] not in cluster_scoped:
            assert doc["metadata"].get("namespace") in namespaces, f"{path}: {doc['kind']} namespace"


def test_the_crd_serves_proxies_with_a_status_subresource() -> None:
    crd = one("CustomResourceDefinition", "proxies.crawl.example.com")
    versions = {v["name"]: v for v in crd["spec"]["versions"]}
    assert versions["v1alpha1"]["subresources"]["status"] == {}


# --- the Deployment ---------------------------------------------------------------------------------


def test_the_pod_runs_non_root_on_a_read_only_root_filesystem() -> None:
    pod, ctr = pod_spec()["securityContext"], container()["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] != 0
    assert ctr["readOnlyRootFilesystem"] is True
    assert ctr["allowPrivilegeEscalation"] is False
    assert ctr["capabilities"]["drop"] == ["ALL"]


def test_writable_places_are_empty_dirs() -> None:
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container()["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in container()["env"]}
    for path in ("/tmp", arg("state-dir")):
        assert "emptyDir" in volumes[mounts[path]], f"{path} is not an emptyDir"
    assert env["PULUMI_HOME"].startswith(arg("state-dir") + "/")


def test_every_mount_has_a_volume_and_secrets_are_read_only() -> None:
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    for mount in container()["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "secret" in volume or "configMap" in volume:
            assert mount.get("readOnly") is True, mount["name"]
    assert volumes["kvm-ssh"]["secret"]["optional"] is True
    kvm = next(m for m in container()["volumeMounts"] if m["name"] == "kvm-ssh")
    assert kvm["mountPath"] == "/etc/proxy-operator/kvm"


def test_memory_and_probes() -> None:
    ctr = container()
    assert ctr["resources"]["requests"]["memory"] == "128Mi"
    assert ctr["resources"]["limits"]["memory"] == "512Mi"
    port = next(p for p in ctr["ports"] if p["name"] == "http")
    assert port["containerPort"] == 8080 == int(arg("port"))
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert ctr["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


def test_two_replicas_rolled_under_leader_election() -> None:
    # Only the Lease holder reconciles: a rollout may run the old and the new pod side by side.
    spec = one("Deployment")["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["type"] == "RollingUpdate"
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    budget = one("PodDisruptionBudget")["spec"]
    assert budget["minAvailable"] == 1
    assert budget["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


def test_serve_runs_the_in_cluster_mode() -> None:
    args = container()["args"]
    assert args[0] == "serve"
    assert not any(a.startswith("--manifests") for a in args), "--manifests would force the folder mode"
    env = {e["name"]: e for e in container()["env"]}
    assert env["PROXY_OPERATOR_INSTALLATION"]["value"], "the stack owner must not be generated per pod"
    assert env["PROXY_OPERATOR_KUBE_IDENTITY"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["PROXY_OPERATOR_KUBE_LEASE_NAME"]["value"] == "proxy-operator"
    lease_role = one("Role", "proxy-operator-election")
    assert lease_role["metadata"]["namespace"] == one("Deployment")["metadata"]["namespace"]


def test_the_catalogue_config_map_is_read_through_the_api_not_mounted() -> None:
    env = {e["name"]: e.get("value") for e in container()["env"]}
    name, key = env["PROXY_OPERATOR_KUBE_CATALOGUE_CONFIGMAP"], env["PROXY_OPERATOR_KUBE_CATALOGUE_KEY"]
    sample = one("ConfigMap", name)
    assert key in sample["data"]
    assert sample["metadata"]["namespace"] == one("Deployment")["metadata"]["namespace"]
    assert not [v for v in pod_spec()["volumes"] if "configMap" in v]


def granted_in(namespace: str) -> list[dict[str, Any]]:
    """The rules the pod's ServiceAccount holds in `namespace`: its RoleBindings there (to a Role or a
    ClusterRole) and its ClusterRoleBindings."""
    account = one("ServiceAccount")["metadata"]
    subject = {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    bindings = [b for b in objects("RoleBinding") if b["metadata"]["namespace"] == namespace]
    bindings += objects("ClusterRoleBinding")
    rules: list[dict[str, Any]] = []
    for binding in bindings:
        if subject not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        for role in objects(ref["kind"]):
            if role["metadata"]["name"] == ref["name"] and (
                ref["kind"] == "ClusterRole" or role["metadata"]["namespace"] == namespace
            ):
                rules += role["rules"]
    return rules


def test_the_service_may_watch_what_the_in_cluster_mode_watches() -> None:
    # service/sources/kubernetes.py: Proxies and labelled Secrets in each watched namespace, and Secrets and
    # the catalogue ConfigMap in the service's own namespace (seen refused as 403 in the image's run).
    env = {e["name"]: e.get("value") for e in container()["env"]}
    namespaces = yaml.safe_load(env["PROXY_OPERATOR_KUBE_NAMESPACES"])
    assert namespaces, "an empty list watches every namespace and needs Secret list/watch cluster-wide"
    for namespace in namespaces:
        rules = granted_in(namespace)
        assert {"list", "watch"} <= granted(rules, "crawl.example.com", "proxies"), namespace
        assert {"list", "watch"} <= granted(rules, "", "secrets"), namespace
    own = granted_in(one("Deployment")["metadata"]["namespace"])
    assert {"list", "watch"} <= granted(own, "", "secrets")
    assert {"list", "watch"} <= granted(own, "", "configmaps")
    assert {"get", "create", "update"} <= granted(own, "coordination.k8s.io", "leases")


def test_every_operator_variable_is_a_real_setting() -> None:
    known = {f"PROXY_OPERATOR_{name.upper()}" for name in OperatorSettings.model_fields}
    known |= {f"PROXY_OPERATOR_DISCOVERY_{name.upper()}" for name in DiscoverySettings.model_fields}
    known |= {f"PROXY_OPERATOR_HEALTH_{name.upper()}" for name in HealthSettings.model_fields}
    known |= {f"PROXY_OPERATOR_KUBE_{name.upper()}" for name in KubeSettings.model_fields}
    known |= {f"PROXY_OPERATOR_UI_{name.upper()}" for name in UiSettings.model_fields}
    names = {e["name"] for e in container()["env"] if e["name"].startswith("PROXY_OPERATOR_")}
    assert names, "no PROXY_OPERATOR_* variable at all?"
    assert names - known - PROGRAM_ENV == set()


def test_every_secret_and_config_map_it_names_has_a_sample() -> None:
    samples = {(d["kind"], d["metadata"]["name"]): d for _, d in documents()}
    for volume in pod_spec()["volumes"]:
        if "secret" in volume and not volume["secret"].get("optional"):
            assert ("Secret", volume["secret"]["secretName"]) in samples, volume["name"]
        if "configMap" in volume:
            assert ("ConfigMap", volume["configMap"]["name"]) in samples, volume["name"]
    for env in container()["env"]:
        ref = (env.get("valueFrom") or {}).get("secretKeyRef")
        if ref and not ref.get("optional"):
            secret = samples[("Secret", ref["name"])]
            assert ref["key"] in {**secret.get("data", {}), **secret.get("stringData", {})}, ref


def test_the_service_reaches_the_pod() -> None:
    service = one("Service")
    labels = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    port_names = {p["name"] for p in container()["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names


# --- RBAC ---------------------------------------------------------------------------------------------


def granted(rules: list[dict[str, Any]], group: str, resource: str) -> set[str]:
    return {
        verb
        for rule in rules
        if group in rule["apiGroups"] and resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_cluster_role_grants_what_the_kubernetes_source_needs() -> None:
    """Exactly what tests/kube/test_rbac_audit.py saw the service use (the audit log proves it there)."""
    rules = one("ClusterRole")["rules"]
    # create, delete: a pool's children (service/kube/pools.py)
    assert granted(rules, "crawl.example.com", "proxies") == {
        "get",
        "list",
        "watch",
        "patch",
        "create",
        "delete",
    }
    assert granted(rules, "crawl.example.com", "proxies/status") == {"patch"}
    assert granted(rules, "crawl.example.com", "proxypools") == {"list", "watch"}
    assert granted(rules, "crawl.example.com", "proxypools/status") == {"patch"}
    assert not granted(rules, "crawl.example.com", "proxypools/finalizers")  # blockOwnerDeletion is false
    assert not granted(rules, "crawl.example.com", "proxies/finalizers")  # blockOwnerDeletion is false
    assert granted(rules, "", "events") == {"create", "patch"}
    assert not granted(rules, "", "secrets")
    assert not granted(rules, "", "configmaps")


def test_nothing_is_bound_cluster_wide() -> None:
    """The ClusterRole is bound per namespace holding Proxies (RoleBinding), as the credentials Role is."""
    assert not objects("ClusterRoleBinding")
    env = {e["name"]: e.get("value") for e in container()["env"]}
    for namespace in yaml.safe_load(env["PROXY_OPERATOR_KUBE_NAMESPACES"]):
        refs = {
            (b["roleRef"]["kind"], b["roleRef"]["name"])
            for b in objects("RoleBinding")
            if b["metadata"]["namespace"] == namespace
        }
        assert ("ClusterRole", "proxy-operator") in refs, namespace


def test_the_service_namespace_role_reads_only_the_catalogue_config_map() -> None:
    own = one("ServiceAccount")["metadata"]["namespace"]
    role = one("Role", "proxy-operator-config")
    assert role["metadata"]["namespace"] == own
    env = {e["name"]: e.get("value") for e in container()["env"]}
    configmaps = [r for r in role["rules"] if "configmaps" in r["resources"]]
    assert [r["resourceNames"] for r in configmaps] == [[env["PROXY_OPERATOR_KUBE_CATALOGUE_CONFIGMAP"]]]
    assert granted(role["rules"], "", "secrets") == {"list", "watch"}  # labelled; no get


def test_leader_election_is_granted_in_the_service_namespace_only() -> None:
    own = one("ServiceAccount")["metadata"]["namespace"]
    roles = {
        r["metadata"]["namespace"]: r["rules"]
        for r in objects("Role")
        if r["metadata"]["name"].endswith("election")
    }
    assert granted(roles[own], "coordination.k8s.io", "leases") == {"get", "create", "update"}
    assert granted(roles[own], "", "pods") == {"get"}  # is the replica holding a stack lock gone?
    assert not granted(one("ClusterRole")["rules"], "coordination.k8s.io", "leases")


def test_the_bindings_name_the_pod_service_account() -> None:
    account = one("ServiceAccount")["metadata"]
    assert pod_spec()["serviceAccountName"] == account["name"]
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for binding in objects(kind):
            subjects = [(s["name"], s["namespace"]) for s in binding["subjects"]]
            assert subjects == [(account["name"], account["namespace"])], binding["metadata"]["name"]


def test_each_kubernetes_entry_namespace_has_a_role_for_its_workloads() -> None:
    catalogue = parse_catalogue(one("ConfigMap", "proxy-operator-providers"))
    namespaces = {e.namespace for e in catalogue.providers if e.type == "kubernetes"}
    assert namespaces, "the sample catalogue has no kubernetes entry"
    roles = {r["metadata"]["namespace"]: r["rules"] for r in objects("Role")}
    for namespace in namespaces:
        assert {"create", "delete"} <= granted(roles[namespace], "apps", "deployments"), namespace
        assert {"create", "delete"} <= granted(roles[namespace], "networking.k8s.io", "networkpolicies")


# --- samples --------------------------------------------------------------------------------------------


def test_the_samples_parse_with_the_service_own_models() -> None:
    assert parse_catalogue(one("ConfigMap", "proxy-operator-providers")).names()
    tokens = one("Secret", "proxy-operator-tokens")["stringData"]["tokens.yaml"]
    scopes = {entry.name: set(entry.scopes) for entry in parse_tokens(tokens)}
    assert scopes == {
        "crawler-fleet": {"lease", "report"},
        "ops": {"lease", "report", "admin"},
        "on-call": {"view"},
    }
    env = {e["name"]: e.get("value") for e in container()["env"]}
    assert Path(env["PROXY_OPERATOR_DISCOVERY_TOKENS_FILE"]).name == "tokens.yaml"
    # the page's session key sits beside the tokens, in the same Secret (one key for every replica)
    assert (
        Path(env["PROXY_OPERATOR_UI_SESSION_KEY_FILE"]).parent
        == Path(env["PROXY_OPERATOR_DISCOVERY_TOKENS_FILE"]).parent
    )


# --- docs -----------------------------------------------------------------------------------------------


def test_operations_doc_lists_every_setting() -> None:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    for name in OperatorSettings.model_fields:
        if name in ("discovery", "health", "ui"):
            continue  # nested trees: their fields are listed below
        assert f"`PROXY_OPERATOR_{name.upper()}`" in text, name
    nested = (
        ("DISCOVERY_", DiscoverySettings),
        ("HEALTH_", HealthSettings),
        ("KUBE_", KubeSettings),
        ("UI_", UiSettings),
    )
    for prefix, model in nested:
        for name in model.model_fields:
            assert f"`PROXY_OPERATOR_{prefix}{name.upper()}`" in text, name
