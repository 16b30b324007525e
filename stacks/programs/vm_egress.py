"""The egress policy on a VM: nftables rules for the proxy daemon's own user, written by the setup script.

Why in the VM: VPC firewall rules do not govern traffic to the metadata server (and a libvirt network has
none), and tinyproxy cannot filter destinations by address. The kernel judges each new connection of the
daemon's user (`meta skuid`) on the address it actually connects to, after the daemon's own name
resolution, with the order of `stacks.egress.decide`: DNS to the VM's resolvers, metadata refused,
explicit allows, the denied ranges refused, public addresses on allowPorts, everything else refused.
Other users (root's setup, the guest agent) are untouched, and replies to the proxy's clients are
established traffic. Loaded now and at every boot (`/etc/nftables.conf` includes the file).
"""

from __future__ import annotations

import ipaddress

from stacks.egress import METADATA_ADDRESSES, denied_ranges
from stacks.models import EgressSpec

TABLE = "proxy_operator_egress"
RULES_PATH = "/etc/proxy-operator-egress.nft"
DNS_MARK = "@DNS_RULES@"


def _family(cidr: str) -> str:
    return "ip" if ipaddress.ip_network(cidr).version == 4 else "ip6"


def _ports(ports: list[int]) -> str:
    return f" tcp dport {{ {', '.join(str(p) for p in ports)} }}" if ports else ""


def _collapsed(version: int) -> list[str]:
    # An nftables set refuses overlapping intervals (::/96 holds ::1/128).
    networks = [ipaddress.ip_network(cidr) for cidr in denied_ranges(version)]
    return [str(net) for net in ipaddress.collapse_addresses(networks)]  # type: ignore[type-var]


def nft_rules(policy: EgressSpec, *, user: str) -> str:
    """The nftables table; DNS_MARK is replaced at boot by the resolvers of /etc/resolv.conf."""
    metadata = [f"{_family(a)} daddr {a} reject" for a in METADATA_ADDRESSES]
    explicit = [f"{_family(r.cidr)} daddr {r.cidr}{_ports(r.ports)} accept" for r in policy.allow]
    denied = [
        f"{family} daddr {{ {', '.join(_collapsed(v))} }} reject" for family, v in (("ip", 4), ("ip6", 6))
    ]
    public = [f"{_ports(policy.allow_ports).strip()} accept"] if policy.allow_ports else []
    rules = [
        f'meta skuid != "{user}" accept',
        "ct state established,related accept",
        DNS_MARK,
        *metadata,
        *explicit,
        *denied,
        *public,
        "reject",
    ]
    body = "".join(f"    {rule}\n" for rule in rules)
    return (
        f"table inet {TABLE} {{\n  chain output {{\n    type filter hook output priority 0; policy accept;\n"
        f"{body}  }}\n}}\n"
    )


def nft_steps(policy: EgressSpec, *, user: str, heredoc: str) -> str:
    """Shell: install nftables, write the rules with this VM's resolvers, load them now and at boot."""
    return (
        heredoc
        + "NS4=$(awk '/^nameserver/ && $2 !~ /:/ {print $2}' /etc/resolv.conf | paste -sd, -)\n"
        + "NS6=$(awk '/^nameserver/ && $2 ~ /:/ {print $2}' /etc/resolv.conf | paste -sd, -)\n"
        + 'DNS=""\n'
        + '[ -n "$NS4" ] && DNS="ip daddr { $NS4 } meta l4proto { tcp, udp } th dport 53 accept;"\n'
        + '[ -n "$NS6" ] && DNS="$DNS ip6 daddr { $NS6 } meta l4proto { tcp, udp } th dport 53 accept;"\n'
        + f'sed "s|{DNS_MARK}|$DNS|" {RULES_PATH}.in > {RULES_PATH} && rm -f {RULES_PATH}.in\n'
        + f"nft list table inet {TABLE} >/dev/null 2>&1 && nft delete table inet {TABLE}\n"
        + f"nft -f {RULES_PATH}\n"
        + f"grep -q '{RULES_PATH}' /etc/nftables.conf \\\n"
        + f"  || echo 'include \"{RULES_PATH}\"' >> /etc/nftables.conf\n"
        + "systemctl enable nftables\n"
    )
