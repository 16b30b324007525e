"""The egress decision: may a proxy connect to this address and port? Pure, and made after resolution.

Every program enforces the same policy (`spec.egress`, `stacks.models.EgressSpec`): the `local` proxy calls
`decide` on each resolved address before it connects, the 3proxy ACL, the NetworkPolicy and the VMs'
nftables rules are rendered from `DENIED_RANGES`. The order of the checks:

1. the address is canonicalised: an IPv4-mapped (`::ffff:127.0.0.1`) or NAT64 (`64:ff9b::7f00:1`) IPv6
   address is judged as the IPv4 address it reaches;
2. metadata addresses are refused, whatever the rules say (nothing a crawler does needs them);
3. an explicit `allow` rule whose range holds the address (and whose ports hold the port) allows;
4. a denied range (loopback, link-local, private, CGNAT, unique-local, multicast, reserved) refuses;
5. a public address is allowed on `allowPorts` (80 and 443 by default) only.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final

from stacks.models.egress import EgressSpec

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA_ADDRESSES: Final = ("169.254.169.254", "fd00:ec2::254")
# (range, why): what the default refuses. "This network" 0.0.0.0/8 is here because 0.0.0.0 reaches loopback.
DENIED_RANGES: Final[tuple[tuple[str, str], ...]] = (
    ("0.0.0.0/8", "this-network (0.0.0.0 reaches loopback)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (metadata)"),
    ("10.0.0.0/8", "private"),
    ("172.16.0.0/12", "private"),
    ("192.168.0.0/16", "private"),
    ("100.64.0.0/10", "CGNAT"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("198.18.0.0/15", "benchmarking"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved and broadcast"),
    ("::1/128", "loopback"),
    ("::/128", "unspecified"),
    ("::/96", "IPv4-compatible"),
    ("fe80::/10", "link-local"),
    ("fc00::/7", "unique-local (includes fd00:ec2::254)"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
    ("100::/64", "discard"),
)
_NAT64: Final = ipaddress.ip_network("64:ff9b::/96")
_METADATA: Final = frozenset(ipaddress.ip_address(a) for a in METADATA_ADDRESSES)
_DENIED: Final = tuple((ipaddress.ip_network(cidr), why) for cidr, why in DENIED_RANGES)

PROHIBITED = "destination_ip_prohibited"  # RFC 9209's error for a destination the proxy refuses


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str


def canonical(address: IPAddress | str) -> IPAddress:
    """The address a connection to `address` reaches: mapped and NAT64 IPv6 become their IPv4 address."""
    parsed = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return parsed.ipv4_mapped
        if parsed in _NAT64:
            return ipaddress.IPv4Address(int(parsed) & 0xFFFFFFFF)
        if parsed.scope_id:
            return ipaddress.IPv6Address(str(parsed).split("%", 1)[0])
    return parsed


def denied_range(address: IPAddress) -> tuple[IPNetwork, str] | None:
    return next(
        ((net, why) for net, why in _DENIED if address.version == net.version and address in net), None
    )


def decide(policy: EgressSpec, address: IPAddress | str, port: int) -> Verdict:
    """May a proxy under `policy` connect to `address`:`port` (the resolved address, never a name)?"""
    target = canonical(address)
    if target in _METADATA:
        return Verdict(False, f"{target} is a metadata address (always refused)")
    for rule in policy.allow:
        network = ipaddress.ip_network(rule.cidr)
        if target.version == network.version and target in network and (not rule.ports or port in rule.ports):
            return Verdict(True, f"allowed explicitly by {rule.cidr}")
    denied = denied_range(target)
    if denied is not None:
        return Verdict(False, f"{target} is in {denied[0]} ({denied[1]})")
    if port not in policy.allow_ports:
        return Verdict(False, f"port {port} is not in allowPorts {policy.allow_ports}")
    return Verdict(True, "public address on an allowed port")


def denied_ranges(version: int) -> list[str]:
    """The denied ranges of one IP family, as CIDR text (for ACLs, NetworkPolicies and nftables)."""
    return [str(net) for net, _ in _DENIED if net.version == version]
