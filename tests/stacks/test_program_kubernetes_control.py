"""Lease users on proxy pods, as the kubernetes program renders them (stacks/programs/kube_control.py),
asserted on a recording mock: with the service in the cluster (`probe_pods`) and credentials, the forward
proxy also listens for control on its own port, a headless Service names every pod, the NetworkPolicy opens
that port to the service's pods only, and the endpoint exports `control`. Without the service in the
cluster, without credentials, or for 3proxy: none of it, as before.
"""

from __future__ import annotations

from typing import Any

import pytest
from pulumi.runtime import rpc

from stacks.forward_proxy.config import ProxyConfig
from stacks.models import KubernetesProvider
from stacks.programs.context import ProgramSettings
from stacks.programs.probe_allow import ProbePods
from tests.stacks.program_harness import RecordingMocks, install, proxy, run

SECRET = "kubernetes:core/v1:Secret"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SERVICE = "kubernetes:core/v1:Service"
POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
ENTRY = KubernetesProvider(name="in-cluster", type="kubernetes", namespace="proxies")
PODS = ProbePods(namespace="proxy-operator", labels={"app.kubernetes.io/name": "proxy-operator"}, port=8080)
IN_CLUSTER = ProgramSettings(stack="in-cluster", root_dir="/tmp", probe_pods=PODS)
OUTSIDE = ProgramSettings(stack="in-cluster", root_dir="/tmp")
SERVICE_PODS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "proxy-operator"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "proxy-operator"}},
}


@pytest.fixture
def mocks() -> RecordingMocks:
    recording = RecordingMocks()
    install(recording, stack="in-cluster")
    return recording


def config(mocks: RecordingMocks) -> ProxyConfig:
    """The rendered proxy.json, read as the forward proxy reads it (which also validates it)."""
    data = mocks.one(SECRET).inputs["stringData"]
    if isinstance(data, dict) and data.get(rpc._special_sig_key) == rpc._special_secret_sig:
        data = data["value"]
    return ProxyConfig.parse(data["proxy.json"].encode())


def ports(mocks: RecordingMocks) -> list[dict[str, Any]]:
    [container] = mocks.one(DEPLOYMENT).inputs["spec"]["template"]["spec"]["containers"]
    return list(container["ports"])


def services(mocks: RecordingMocks) -> dict[str, dict[str, Any]]:
    return {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in mocks.of_type(SERVICE)}


def test_in_the_cluster_the_pods_listen_for_control_behind_a_headless_service(mocks: RecordingMocks) -> None:
    spec = {"provider": "in-cluster", "port": 8080, "allowedSourceRanges": ["10.1.0.0/16"]}
    outputs = run(entry=ENTRY, proxies=[proxy("a", **spec)], settings=IN_CLUSTER)

    assert config(mocks).control == "tcp://0.0.0.0:9178"
    assert ports(mocks) == [
        {"name": "proxy", "containerPort": 8080, "protocol": "TCP"},
        {"name": "control", "containerPort": 9178, "protocol": "TCP"},
    ]
    assert services(mocks)["px-crawl-a-control"] == {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": {"app.kubernetes.io/instance": "px-crawl-a"},
        "ports": [{"name": "control", "port": 9178, "targetPort": "control", "protocol": "TCP"}],
    }
    assert "9178" not in str(services(mocks)["px-crawl-a"])  # the proxy's own Service publishes no control
    assert outputs["proxies"]["crawl/a"]["control"] == (
        "tcp://px-crawl-a-control.proxies.svc.cluster.local:9178"
    )
    policy = mocks.one(POLICY).inputs["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["ingress"] == [
        {"from": [{"ipBlock": {"cidr": "10.1.0.0/16"}}], "ports": [{"port": "proxy", "protocol": "TCP"}]},
        {"from": [SERVICE_PODS], "ports": [{"port": "control", "protocol": "TCP"}]},
    ]


def test_without_ranges_the_proxy_port_stays_open_and_control_is_the_service_pods_alone(
    mocks: RecordingMocks,
) -> None:
    run(entry=ENTRY, proxies=[proxy("a", provider="in-cluster")], settings=IN_CLUSTER)
    policy = mocks.one(POLICY).inputs["spec"]

    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["ingress"] == [
        {"ports": [{"port": "proxy", "protocol": "TCP"}]},  # no `from`: every source (credentials required)
        {"from": [SERVICE_PODS], "ports": [{"port": "control", "protocol": "TCP"}]},
    ]


def test_a_proxy_on_the_control_port_moves_control_to_the_next(mocks: RecordingMocks) -> None:
    outputs = run(entry=ENTRY, proxies=[proxy("a", provider="in-cluster", port=9178)], settings=IN_CLUSTER)

    assert config(mocks).port == 9178
    assert config(mocks).control == "tcp://0.0.0.0:9179"
    assert [p["containerPort"] for p in ports(mocks)] == [9178, 9179]
    assert outputs["proxies"]["crawl/a"]["control"].endswith(":9179")
    assert mocks.one(POLICY).inputs["spec"]["ingress"][1]["ports"] == [{"port": "control", "protocol": "TCP"}]


def test_a_long_name_keeps_the_control_service_a_dns_label(mocks: RecordingMocks) -> None:
    outputs = run(entry=ENTRY, proxies=[proxy("a" * 60, provider="in-cluster")], settings=IN_CLUSTER)
    [control] = [name for name in services(mocks) if name.endswith("-control")]

    assert len(control) <= 63
    assert outputs["proxies"][f"crawl/{'a' * 60}"]["control"].startswith(f"tcp://{control}.proxies.svc")


@pytest.mark.parametrize(
    ("settings", "spec"),
    [
        (OUTSIDE, {}),  # the service outside the cluster cannot reach pods
        (IN_CLUSTER, {"auth": {"mode": "none"}, "allowedSourceRanges": ["10.1.0.0/16"]}),  # nothing to scope
        (IN_CLUSTER, {"kubernetes": {"image": "ghcr.io/tarampampam/3proxy:1.9.1"}}),  # no control channel
    ],
    ids=["service-outside", "no-credentials", "3proxy"],
)
def test_no_control_without_the_service_in_the_cluster_credentials_or_the_forward_proxy(
    mocks: RecordingMocks, settings: ProgramSettings, spec: dict[str, Any]
) -> None:
    outputs = run(entry=ENTRY, proxies=[proxy("a", provider="in-cluster", **spec)], settings=settings)

    assert "control" not in outputs["proxies"]["crawl/a"]
    assert list(services(mocks)) == ["px-crawl-a"]
    assert [p["name"] for p in ports(mocks)] == ["proxy"]
    assert "9178" not in str(mocks.one(POLICY).inputs["spec"])
    if "kubernetes" not in spec:
        assert config(mocks).control is None
