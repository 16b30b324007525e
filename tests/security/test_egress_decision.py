"""`stacks.egress.decide`, the one egress decision, exhaustively: every spelling of loopback, metadata,
private and CGNAT ranges refused by default; public addresses only on 80/443; explicit widening works and
never reaches the metadata addresses. Fails on the code before issue 11: there was no policy at all."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacks.egress import DENIED_RANGES, METADATA_ADDRESSES, canonical, decide
from stacks.models import EgressSpec, ProxySpec

DEFAULT = ProxySpec.model_validate({"provider": "p"}).egress
PUBLIC_V4 = ["8.8.8.8", "93.184.215.14", "1.1.1.1"]
PUBLIC_V6 = ["2606:4700:4700::1111", "2001:4860:4860::8888"]


def _policy(**wire: object) -> EgressSpec:
    return EgressSpec.model_validate(wire)


def test_the_default_is_ports_80_and_443_and_no_explicit_allows() -> None:
    assert (DEFAULT.allow_ports, DEFAULT.allow) == ([80, 443], [])


@pytest.mark.parametrize("address", PUBLIC_V4 + PUBLIC_V6)
@pytest.mark.parametrize("port", [80, 443])
def test_public_addresses_on_80_and_443_pass(address: str, port: int) -> None:
    assert decide(DEFAULT, address, port).allowed


@pytest.mark.parametrize("port", [25, 22, 53, 587, 6379, 8080, 3128])
def test_other_ports_are_refused_even_to_public_addresses(port: int) -> None:
    verdict = decide(DEFAULT, "8.8.8.8", port)
    assert not verdict.allowed
    assert f"port {port}" in verdict.reason


# Every way of writing "this machine": what getaddrinfo turns each name into (for names the resolver knows).
LOOPBACK_SPELLINGS = [
    "localhost",
    "127.0.0.1",
    "127.1.2.3",
    "::1",
    "::ffff:127.0.0.1",
    "2130706433",
    "0.0.0.0",
]


@pytest.mark.parametrize("spelling", LOOPBACK_SPELLINGS)
@pytest.mark.parametrize("port", [80, 443])
def test_every_spelling_of_loopback_resolves_to_a_refused_address(spelling: str, port: int) -> None:
    addresses = {info[4][0] for info in socket.getaddrinfo(spelling, port, type=socket.SOCK_STREAM)}
    assert addresses
    for address in addresses:
        assert not decide(DEFAULT, address, port).allowed, address


@pytest.mark.parametrize("address", [*METADATA_ADDRESSES, "::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe"])
def test_metadata_is_refused_even_when_its_range_is_allowed_explicitly(address: str) -> None:
    wide = _policy(allow=[{"cidr": "169.254.0.0/16"}, {"cidr": "fd00::/8"}, {"cidr": "::ffff:0:0/96"}])
    assert not decide(DEFAULT, address, 80).allowed
    assert not decide(wide, address, 80).allowed
    assert "metadata" in decide(wide, address, 80).reason


@pytest.mark.parametrize(
    "address",
    [
        *("10.1.2.3", "172.16.0.1", "172.31.255.254", "192.168.1.1", "100.64.0.1", "100.127.255.254"),
        *("169.254.1.1", "fc00::1", "fd12:3456::1", "fe80::1", "fe80::1%1", "::", "224.0.0.1"),
        *("255.255.255.255", "ff02::1"),
    ],
)
def test_private_cgnat_link_local_and_unique_local_are_refused(address: str) -> None:
    assert not decide(DEFAULT, address, 443).allowed


@pytest.mark.parametrize("address", ["172.15.255.255", "172.32.0.1", "100.63.255.255", "100.128.0.1"])
def test_neighbours_of_the_private_ranges_are_public(address: str) -> None:
    assert decide(DEFAULT, address, 443).allowed


def test_an_explicit_allow_opens_its_range_on_its_ports_only() -> None:
    policy = _policy(allow=[{"cidr": "127.0.0.1", "ports": [8080]}])
    assert decide(policy, "127.0.0.1", 8080).allowed
    assert decide(policy, "::ffff:127.0.0.1", 8080).allowed  # the same destination
    assert not decide(policy, "127.0.0.1", 6379).allowed
    assert not decide(policy, "127.0.0.2", 8080).allowed
    assert not decide(policy, "::1", 8080).allowed  # another family, another rule


def test_an_allow_without_ports_opens_every_port_of_its_range() -> None:
    policy = _policy(allow=[{"cidr": "10.20.0.0/16"}])
    assert decide(policy, "10.20.3.4", 5432).allowed
    assert not decide(policy, "10.21.3.4", 5432).allowed


def test_allow_ports_widens_public_destinations_only() -> None:
    policy = _policy(allowPorts=[25, 80, 443])
    assert decide(policy, "8.8.8.8", 25).allowed
    assert not decide(policy, "10.0.0.1", 25).allowed
    assert not decide(policy, "127.0.0.1", 80).allowed


ipv4 = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address)
ipv6 = st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address)
ports = st.integers(1, 65535)


@given(address=ipv4, port=ports)
def test_a_mapped_or_nat64_ipv6_address_gets_the_verdict_of_its_ipv4_address(
    address: ipaddress.IPv4Address, port: int
) -> None:
    mapped = ipaddress.IPv6Address(f"::ffff:{address}")
    nat64 = ipaddress.IPv6Address(int(ipaddress.IPv6Address("64:ff9b::")) + int(address))
    expected = decide(DEFAULT, address, port).allowed
    assert decide(DEFAULT, mapped, port).allowed is expected
    assert decide(DEFAULT, nat64, port).allowed is expected


@given(address=st.one_of(ipv4, ipv6), port=ports)
def test_an_allowed_default_destination_is_public_and_on_80_or_443(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int
) -> None:
    if decide(DEFAULT, address, port).allowed:
        reached = canonical(address)
        assert port in (80, 443)
        assert not reached.is_loopback
        assert not reached.is_link_local
        assert not reached.is_multicast
        assert not any(
            reached in ipaddress.ip_network(cidr)
            for cidr, _ in DENIED_RANGES
            if ipaddress.ip_network(cidr).version == reached.version
        )


@given(network=st.sampled_from([cidr for cidr, _ in DENIED_RANGES]), offset=st.integers(0, 2**64), port=ports)
def test_every_address_of_a_denied_range_is_refused(network: str, offset: int, port: int) -> None:
    net = ipaddress.ip_network(network)
    address = net[offset % net.num_addresses]
    assert not decide(DEFAULT, address, port).allowed


@given(address=st.one_of(ipv4, ipv6), port=ports)
def test_an_allow_rule_for_the_address_always_allows_it_unless_metadata(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int
) -> None:
    reached = canonical(address)
    policy = _policy(allow=[{"cidr": str(reached), "ports": [port]}])
    assert decide(policy, address, port).allowed is (str(reached) not in METADATA_ADDRESSES)
