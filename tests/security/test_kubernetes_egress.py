"""The kubernetes program enforces spec.egress twice: the proxy's own policy and the NetworkPolicy's rules.

Mocked (`pulumi.runtime.set_mocks`, fresh per test): these check the rendering; tests/kube/test_proxy_pods.py
sends the traffic through real pods on the test node. The default daemon is the forward proxy, which judges
with the same code as `local` (`stacks.egress.decide` on the resolved address); a Proxy naming a 3proxy image
gets 3proxy's ACL. Fails on the code before issue 11: 3proxy allowed every destination and the
NetworkPolicy governed ingress only.
"""

from __future__ import annotations

from typing import Any

import pytest
from pulumi.runtime import rpc

from service.kube.settings import KubeSettings
from stacks.egress import decide
from stacks.forward_proxy.config import ProxyConfig
from stacks.models import KubernetesProvider
from stacks.programs.context import ProgramSettings
from stacks.programs.probe_allow import ProbePods
from tests.stacks.conftest import current_event_loop  # noqa: F401 (the fixture, used below)
from tests.stacks.program_harness import GENERATED, RecordingMocks, install, proxy, run

SECRET = "kubernetes:core/v1:Secret"
POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
ENTRY = KubernetesProvider(name="in-cluster", type="kubernetes", namespace="proxies")
SETTINGS = ProgramSettings(stack="in-cluster", root_dir="/tmp")

# Pulumi mocks need a current event loop, which an asyncio.run elsewhere in the run takes away.
pytestmark = pytest.mark.usefixtures("current_event_loop")


@pytest.fixture
def mocks() -> RecordingMocks:
    recording = RecordingMocks(computed={SECRET: lambda o: {"metadata": {**o["metadata"], "name": "px-s"}}})
    install(recording, stack="in-cluster")
    return recording


THREEPROXY = {"image": "ghcr.io/tarampampam/3proxy:1.9.1"}


def _data(mocks: RecordingMocks) -> dict[str, Any]:
    data = mocks.one(SECRET).inputs["stringData"]
    if isinstance(data, dict) and data.get(rpc._special_sig_key) == rpc._special_secret_sig:
        data = data["value"]
    return dict(data)


def _config(mocks: RecordingMocks) -> list[str]:
    return str(_data(mocks)["3proxy.cfg"]).splitlines()


def _allowed(mocks: RecordingMocks, address: str, port: int) -> bool:
    policy = ProxyConfig.parse(str(_data(mocks)["proxy.json"]).encode()).egress
    return decide(policy, address, port).allowed


def test_the_forward_proxy_refuses_metadata_and_private_ranges_and_allows_public_on_80_443(
    mocks: RecordingMocks,
) -> None:
    run(entry=ENTRY, proxies=[proxy("a", provider="in-cluster")], settings=SETTINGS)
    for address in ("169.254.169.254", "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1"):
        assert not _allowed(mocks, address, 443), address
    for address in ("::1", "fe80::1", "fd00::1", "fd00:ec2::254"):
        assert not _allowed(mocks, address, 443), address
    assert _allowed(mocks, "93.184.215.14", 443)
    assert _allowed(mocks, "93.184.215.14", 80)
    assert not _allowed(mocks, "93.184.215.14", 22)


def test_the_forward_proxy_takes_an_explicit_allow_into_a_private_range(mocks: RecordingMocks) -> None:
    egress = {"allow": [{"cidr": "10.96.0.10", "ports": [8080]}], "allowPorts": [443]}
    run(entry=ENTRY, proxies=[proxy("a", provider="in-cluster", egress=egress)], settings=SETTINGS)
    assert _allowed(mocks, "10.96.0.10", 8080)
    assert not _allowed(mocks, "10.96.0.10", 8081)
    assert not _allowed(mocks, "10.96.0.11", 8080)
    assert _allowed(mocks, "93.184.215.14", 443)
    assert not _allowed(mocks, "93.184.215.14", 80)


def test_3proxy_refuses_metadata_and_private_ranges_and_allows_public_on_80_443(
    mocks: RecordingMocks,
) -> None:
    run(entry=ENTRY, proxies=[proxy("a", provider="in-cluster", kubernetes=THREEPROXY)], settings=SETTINGS)
    config = _config(mocks)
    user = GENERATED["username"]
    metadata, denied, public = (
        config.index(line) for line in config if line.startswith(("deny * * ", f"allow {user}"))
    )
    assert config[metadata] == "deny * * 169.254.169.254,fd00:ec2::254"
    for cidr in (
        "127.0.0.0/8",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "169.254.0.0/16",
    ):
        assert cidr in config[denied].split(" ")[3].split(",")
    for cidr in ("::1/128", "fe80::/10", "fc00::/7"):
        assert cidr in config[denied].split(" ")[3].split(",")
    assert config[public] == f"allow {user} * * 80,443"
    assert metadata < denied < public < config.index("deny *")


def test_3proxy_takes_an_explicit_allow_before_the_denied_ranges(mocks: RecordingMocks) -> None:
    egress = {"allow": [{"cidr": "10.96.0.10", "ports": [8080]}], "allowPorts": [443]}
    spec = {"provider": "in-cluster", "egress": egress, "kubernetes": THREEPROXY}
    run(entry=ENTRY, proxies=[proxy("a", **spec)], settings=SETTINGS)
    config = _config(mocks)
    user = GENERATED["username"]
    explicit = config.index(f"allow {user} * 10.96.0.10/32 8080")
    denied = next(i for i, line in enumerate(config) if line.startswith("deny * * 0.0.0.0/8"))
    assert explicit < denied < config.index(f"allow {user} * * 443")


def test_the_network_policy_limits_egress_even_without_source_ranges(mocks: RecordingMocks) -> None:
    run(entry=ENTRY, proxies=[proxy("a", provider="in-cluster")], settings=SETTINGS)
    spec: dict[str, Any] = mocks.one(POLICY).inputs["spec"]
    assert "Egress" in spec["policyTypes"]
    public, dns = spec["egress"]
    v4, v6 = (block["ipBlock"] for block in public["to"])
    assert (v4["cidr"], v6["cidr"]) == ("0.0.0.0/0", "::/0")
    for cidr in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "169.254.0.0/16",
        "127.0.0.0/8",
    ):
        assert cidr in v4["except"]
    for cidr in ("fc00::/7", "fe80::/10", "::1/128"):
        assert cidr in v6["except"]
    assert public["ports"] == [{"port": 80, "protocol": "TCP"}, {"port": 443, "protocol": "TCP"}]
    assert "to" not in dns
    assert {p["port"] for p in dns["ports"]} == {53}


def test_the_probe_endpoint_is_allowed_by_the_program(mocks: RecordingMocks) -> None:
    settings = ProgramSettings(stack="in-cluster", root_dir="/tmp", probe_url="http://10.96.7.7:8080/v1/echo")
    run(entry=ENTRY, proxies=[proxy("a", provider="in-cluster")], settings=settings)
    assert _allowed(mocks, "10.96.7.7", 8080)
    assert not _allowed(mocks, "10.96.7.7", 8081)
    rules = mocks.one(POLICY).inputs["spec"]["egress"]
    assert {
        "to": [{"ipBlock": {"cidr": "10.96.7.7/32"}}],
        "ports": [{"port": 8080, "protocol": "TCP"}],
    } in rules


def test_the_probe_reaches_the_service_pods_by_selector_in_a_cluster(mocks: RecordingMocks) -> None:
    """A NetworkPolicy judges the probe after the Service's DNAT: its destination is a service pod on the
    listen port, not the ClusterIP, so the program names the service's pods by namespace and labels."""
    pods = ProbePods(
        namespace="proxy-operator", labels={"app.kubernetes.io/name": "proxy-operator"}, port=8080
    )
    settings = ProgramSettings(
        stack="in-cluster",
        root_dir="/tmp",
        probe_url="http://10.96.7.7:80/v1/echo",
        probe_pods=ProbePods.parse(KubeSettings(namespace="proxy-operator").probe_pods(8080)),
    )
    assert settings.probe_pods == pods
    run(entry=ENTRY, proxies=[proxy("a", provider="in-cluster")], settings=settings)
    rules = mocks.one(POLICY).inputs["spec"]["egress"]
    assert {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "proxy-operator"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "proxy-operator"}},
            }
        ],
        "ports": [{"port": 8080, "protocol": "TCP"}],
    } in rules
    assert _allowed(mocks, "10.96.7.7", 80)  # the proxy itself dials the ClusterIP


def test_outside_a_cluster_no_rule_names_pods(mocks: RecordingMocks) -> None:
    assert ProbePods.parse("") is None
    run(entry=ENTRY, proxies=[proxy("a", provider="in-cluster")], settings=SETTINGS)
    rules = mocks.one(POLICY).inputs["spec"]["egress"]
    assert not [peer for rule in rules for peer in rule.get("to", []) if "podSelector" in peer]
