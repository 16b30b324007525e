"""The kubernetes program enforces spec.egress twice: 3proxy's ACL and the NetworkPolicy's egress rules.

Mocked (`pulumi.runtime.set_mocks`, fresh per test): no pod runs on the test API server (no kubelet), so
the rendering is what can be checked here. Fails on the code before issue 11: 3proxy allowed every
destination and the NetworkPolicy governed ingress only.
"""

from __future__ import annotations

from typing import Any

import pytest
from pulumi.runtime import rpc

from stacks.models import KubernetesProvider
from stacks.programs.context import ProgramSettings
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


def _config(mocks: RecordingMocks) -> list[str]:
    data = mocks.one(SECRET).inputs["stringData"]
    if isinstance(data, dict) and data.get(rpc._special_sig_key) == rpc._special_secret_sig:
        data = data["value"]
    return str(data["3proxy.cfg"]).splitlines()


def test_3proxy_refuses_metadata_and_private_ranges_and_allows_public_on_80_443(
    mocks: RecordingMocks,
) -> None:
    run(entry=ENTRY, proxies=[proxy("a", provider="in-cluster")], settings=SETTINGS)
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


def test_an_explicit_allow_comes_before_the_denied_ranges(mocks: RecordingMocks) -> None:
    egress = {"allow": [{"cidr": "10.96.0.10", "ports": [8080]}], "allowPorts": [443]}
    run(entry=ENTRY, proxies=[proxy("a", provider="in-cluster", egress=egress)], settings=SETTINGS)
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
    assert f"allow {GENERATED['username']} * 10.96.7.7/32 8080" in _config(mocks)
    rules = mocks.one(POLICY).inputs["spec"]["egress"]
    assert {
        "to": [{"ipBlock": {"cidr": "10.96.7.7/32"}}],
        "ports": [{"port": 8080, "protocol": "TCP"}],
    } in rules
