"""The kubernetes program's manifests, asserted on a recording mock.

These tests mock with `pulumi.runtime.set_mocks` because the kubernetes provider plugin cannot be downloaded
or run here (nor is there a cluster); each test installs fresh mocks and runs the program under
`pulumi.runtime.test`.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pytest
from pulumi.runtime import rpc

from stacks.forward_proxy.config import ProxyConfig
from stacks.forward_proxy.control import FOLLOW_SECONDS
from stacks.models import DEFAULT_KUBERNETES_IMAGE, KubernetesProvider
from stacks.programs import kubernetes, threeproxy
from stacks.programs.context import ProgramSettings
from tests.stacks.program_harness import GENERATED, RecordingMocks, install, proxy, run

SECRET = "kubernetes:core/v1:Secret"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SERVICE = "kubernetes:core/v1:Service"
POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
LB_IP = "198.51.100.20"
SECRET_NAME = "px-crawl-a-5x7k2m9q"
ENTRY = KubernetesProvider(name="in-cluster", type="kubernetes", namespace="proxies")
SETTINGS = ProgramSettings(stack="in-cluster", root_dir="/tmp")


def _named(outputs: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {**outputs["metadata"], "name": SECRET_NAME}}


def _load_balancer(outputs: dict[str, Any]) -> dict[str, Any]:
    if outputs["spec"]["type"] != "LoadBalancer":
        return {}
    return {"status": {"loadBalancer": {"ingress": [{"ip": LB_IP}]}}}


@pytest.fixture
def mocks() -> RecordingMocks:
    recording = RecordingMocks(computed={SECRET: _named, SERVICE: _load_balancer})
    install(recording, stack="in-cluster")
    return recording


def _unsecret(value: Any) -> Any:
    if isinstance(value, dict) and value.get(rpc._special_sig_key) == rpc._special_secret_sig:
        return value["value"]
    return value


def _pod(mocks: RecordingMocks) -> dict[str, Any]:
    return mocks.one(DEPLOYMENT).inputs["spec"]["template"]["spec"]


def test_deployment_is_non_root_read_only_limited_and_probed_on_the_proxy_port(mocks: RecordingMocks) -> None:
    run(entry=ENTRY, proxies=[proxy("a", provider="in-cluster", port=8080)], settings=SETTINGS)
    pod = _pod(mocks)
    [container] = pod["containers"]
    security = container["securityContext"]

    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["limits"] == {"cpu": "500m", "memory": "128Mi"}
    assert container["readinessProbe"]["tcpSocket"] == {"port": 8080}
    # Ready only after the service's round that gives a new pod the live lease users (control.FOLLOW_SECONDS)
    assert container["readinessProbe"]["initialDelaySeconds"] > FOLLOW_SECONDS
    assert container["readinessProbe"]["periodSeconds"] == 2
    assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    assert container["ports"] == [{"name": "proxy", "containerPort": 8080, "protocol": "TCP"}]
    assert container["image"] == DEFAULT_KUBERNETES_IMAGE
    assert container["command"] == ["proxy-operator-forward-proxy", "/etc/proxy-operator/proxy.json"]
    assert container["volumeMounts"][0]["mountPath"] == "/etc/proxy-operator"
    assert pod["automountServiceAccountToken"] is False
    assert pod["volumes"][0]["secret"]["secretName"] == SECRET_NAME


def test_credentials_and_ranges_are_in_the_secret_and_the_proxy_config(mocks: RecordingMocks) -> None:
    spec = {"provider": "in-cluster", "port": 8080, "allowedSourceRanges": ["10.0.0.0/8", "192.168.0.0/16"]}
    outputs = run(entry=ENTRY, proxies=[proxy("a", **spec)], settings=SETTINGS)
    raw = mocks.one(SECRET).inputs["stringData"]
    data = _unsecret(raw)
    config = ProxyConfig.parse(data["proxy.json"].encode())  # what the forward proxy itself reads

    assert raw != data, "the Secret's data must be a Pulumi secret"
    assert (data["username"], data["password"]) == (GENERATED["username"], GENERATED["password"])
    assert (config.username, config.password) == (GENERATED["username"], GENERATED["password"])
    assert (config.bind, config.port, config.protocol) == ("0.0.0.0", 8080, "http")
    assert config.sources == ("10.0.0.0/8", "192.168.0.0/16")
    assert config.egress.allow_ports == [80, 443]
    assert config.control is None
    assert outputs["credentials"]["crawl/a"] == GENERATED


def test_socks5_and_a_privileged_port(mocks: RecordingMocks) -> None:
    run(
        entry=ENTRY,
        proxies=[proxy("a", provider="in-cluster", port=1080, protocol="socks5")],
        settings=SETTINGS,
    )
    config = ProxyConfig.parse(_unsecret(mocks.one(SECRET).inputs["stringData"])["proxy.json"].encode())
    run_port = mocks.one(SERVICE).inputs["spec"]["ports"][0]

    assert (config.protocol, config.port) == ("socks5", 1080)
    assert run_port == {"name": "proxy", "port": 1080, "targetPort": "proxy", "protocol": "TCP"}
    mocks.resources.clear()
    run(entry=ENTRY, proxies=[proxy("b", provider="in-cluster", port=80)], settings=SETTINGS)
    # Below 1024 the container listens on 3128 (no NET_BIND_SERVICE); the Service still publishes port 80.
    [container] = _pod(mocks)["containers"]
    assert container["ports"] == [{"name": "proxy", "containerPort": 3128, "protocol": "TCP"}]
    assert (
        ProxyConfig.parse(_unsecret(mocks.one(SECRET).inputs["stringData"])["proxy.json"].encode()).port
        == 3128
    )


def test_a_proxy_naming_a_3proxy_image_keeps_3proxy_and_its_configuration(mocks: RecordingMocks) -> None:
    """The default before issue 19: a Proxy that names it explicitly keeps the same command, mount and
    configuration file, so the upgrade rolls none of its pods."""
    image = "ghcr.io/tarampampam/3proxy:1.9.1"
    spec = {"provider": "in-cluster", "port": 8080, "allowedSourceRanges": ["10.0.0.0/8", "192.168.0.0/16"]}
    run(entry=ENTRY, proxies=[proxy("a", **spec, kubernetes={"image": image})], settings=SETTINGS)
    [container] = _pod(mocks)["containers"]
    data = _unsecret(mocks.one(SECRET).inputs["stringData"])
    config = data["3proxy.cfg"].splitlines()

    assert (container["image"], container["command"]) == (
        image,
        ["/bin/3proxy", "/etc/3proxy-operator/3proxy.cfg"],
    )
    assert container["volumeMounts"][0]["mountPath"] == "/etc/3proxy-operator"
    assert "proxy.json" not in data
    assert f"users {GENERATED['username']}:CL:{GENERATED['password']}" in config
    assert "auth strong" in config
    assert f"allow {GENERATED['username']} 10.0.0.0/8,192.168.0.0/16 * 80,443" in config
    assert config[-2:] == ["deny *", "proxy -a -n -p8080"]


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("ghcr.io/tarampampam/3proxy:1.9.1", True),
        ("registry.example/mirror/3proxy@sha256:" + "0" * 64, True),
        ("3proxy", True),
        ("ghcr.io/example/proxy-operator:0.1.0", False),
        ("ghcr.io/3proxy/other:1", False),
        ("localhost:5000/3proxy-fork:2", False),
    ],
)
def test_which_images_are_3proxy(image: str, expected: bool) -> None:
    assert threeproxy.is_threeproxy(image) is expected


def test_cluster_ip_publishes_the_cluster_dns_name(mocks: RecordingMocks) -> None:
    outputs = run(entry=ENTRY, proxies=[proxy("a", provider="in-cluster", port=3128)], settings=SETTINGS)

    assert outputs["proxies"]["crawl/a"] == {
        "host": "px-crawl-a.proxies.svc.cluster.local",
        "port": 3128,
        "protocol": "http",
        "instanceId": "crawl/a-id",
    }
    assert mocks.one(SERVICE).inputs["metadata"]["name"] == "px-crawl-a"


def test_load_balancer_publishes_the_ingress_ip_and_limits_sources(mocks: RecordingMocks) -> None:
    spec = {
        "provider": "in-cluster",
        "allowedSourceRanges": ["203.0.113.0/24"],
        "kubernetes": {"serviceType": "LoadBalancer"},
    }
    outputs = run(entry=ENTRY, proxies=[proxy("a", **spec)], settings=SETTINGS)
    service = mocks.one(SERVICE).inputs["spec"]

    assert outputs["proxies"]["crawl/a"]["host"] == LB_IP
    assert service["loadBalancerSourceRanges"] == ["203.0.113.0/24"]
    assert service["externalTrafficPolicy"] == "Local"


def test_network_policy_admits_only_the_ranges_on_the_proxy_port(mocks: RecordingMocks) -> None:
    spec = {"provider": "in-cluster", "port": 8080, "allowedSourceRanges": ["10.1.0.0/16"]}
    run(entry=ENTRY, proxies=[proxy("a", **spec), proxy("open", provider="in-cluster")], settings=SETTINGS)
    by_name = {p.inputs["metadata"]["name"]: p for p in mocks.of_type(POLICY)}
    policy, open_policy = by_name["px-crawl-a"], by_name["px-crawl-open"]
    rules = policy.inputs["spec"]
    # Without ranges the policy governs egress only: the port stays open (credentials are required then).
    assert open_policy.inputs["spec"]["policyTypes"] == ["Egress"]
    assert "ingress" not in open_policy.inputs["spec"]

    assert rules["policyTypes"] == ["Ingress", "Egress"]
    assert rules["podSelector"] == {"matchLabels": {"app.kubernetes.io/instance": "px-crawl-a"}}
    assert rules["ingress"] == [
        {"from": [{"ipBlock": {"cidr": "10.1.0.0/16"}}], "ports": [{"port": "proxy", "protocol": "TCP"}]}
    ]


def test_every_object_is_labelled_with_the_service_the_proxy_and_the_stack(mocks: RecordingMocks) -> None:
    spec = {"provider": "in-cluster", "allowedSourceRanges": ["10.1.0.0/16"]}
    run(entry=ENTRY, proxies=[proxy("a", namespace="team-x", **spec)], settings=SETTINGS)

    for typ in (SECRET, DEPLOYMENT, SERVICE, POLICY):
        metadata = mocks.one(typ).inputs["metadata"]
        assert metadata["namespace"] == "proxies"
        assert metadata["labels"]["app.kubernetes.io/managed-by"] == "proxy-operator"
        assert metadata["labels"]["crawl.example.com/proxy-namespace"] == "team-x"
        assert metadata["labels"]["crawl.example.com/proxy-name"] == "a"
        assert metadata["labels"]["crawl.example.com/stack"] == "in-cluster"


@pytest.mark.parametrize(
    ("kubeconfig_secret", "expect_kubeconfig"), [(None, False), ("remote-kubeconfig", True)]
)
def test_provider_uses_the_kubeconfig_only_when_the_catalogue_names_one(
    mocks: RecordingMocks,
    kubeconfig_secret: str | None,
    expect_kubeconfig: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)  # the SDK would take it as the default kubeconfig
    entry = KubernetesProvider(name="in-cluster", type="kubernetes", kubeconfigSecret=kubeconfig_secret)
    settings = ProgramSettings(
        stack="in-cluster", root_dir="/tmp", provider_credentials=pulumi.Output.secret("kc")
    )
    run(entry=entry, proxies=[proxy("a", provider="in-cluster")], settings=settings)
    [k8s_provider] = [r for r in mocks.resources if r.typ == "pulumi:providers:kubernetes"]

    assert k8s_provider.inputs["namespace"] == "proxies"
    assert ("kubeconfig" in k8s_provider.inputs) is expect_kubeconfig


def _annotations(mocks: RecordingMocks) -> dict[str, dict[str, str]]:
    return {
        typ: mocks.one(typ).inputs["metadata"]["annotations"] for typ in (SECRET, DEPLOYMENT, SERVICE, POLICY)
    }


def test_every_object_forces_its_apply_and_nothing_skips_the_providers_await(mocks: RecordingMocks) -> None:
    """Every object asks for a forced apply, so a field someone else took over is put back instead of
    failing the stack with a conflict. None skips the provider's await or deletes in the background (the
    test-only bare-apiserver mode is gone: tests/kube runs against a node with a kubelet)."""
    spec = {"provider": "in-cluster", "allowedSourceRanges": ["10.1.0.0/16"]}
    run(entry=ENTRY, proxies=[proxy("a", **spec)], settings=SETTINGS)

    for typ, found in _annotations(mocks).items():
        assert found == {"pulumi.com/patchForce": "true"}, typ


def test_a_load_balancer_without_an_address_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mocks used to hand every LoadBalancer an IP; a real cluster without a load-balancer controller
    (or the provider with skipAwait) reports none, which the program must not read as `ingress[0]`."""
    install(RecordingMocks(computed={SECRET: _named}), stack="in-cluster")
    spec = {"provider": "in-cluster", "kubernetes": {"serviceType": "LoadBalancer"}}

    with pytest.raises(
        kubernetes.LoadBalancerPendingError, match="px-crawl-a has no load-balancer address yet"
    ):
        run(entry=ENTRY, proxies=[proxy("a", **spec)], settings=SETTINGS)
