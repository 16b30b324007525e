"""3proxy in a `kubernetes` pod: kept for Proxies that name a 3proxy image explicitly.

Until issue 19 the program's default image was `ghcr.io/tarampampam/3proxy:1.9.1`, configured by a file this
module writes. The default is now the project's own forward proxy (docs/decisions.md, "The proxy in pods and
VMs"); a Proxy whose `kubernetes.image` names a 3proxy image (its repository's last segment is `3proxy`)
keeps this configuration, byte for byte, so its pods do not roll on the upgrade.

3proxy matches IP targets on the resolved address, so the egress policy is its ACL, first match wins.
"""

from __future__ import annotations

from stacks.egress import METADATA_ADDRESSES, denied_ranges
from stacks.models import EgressSpec
from stacks.programs.proxy_config import ProxySettings

CONFIG_DIR = "/etc/3proxy-operator"
CONFIG_KEY = "3proxy.cfg"


def is_threeproxy(image: str) -> bool:
    """Does `image` (`registry/path/name:tag@digest`) name a 3proxy image?"""
    name = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return name.split(":", 1)[0] == "3proxy"


def command() -> list[str]:
    return ["/bin/3proxy", f"{CONFIG_DIR}/{CONFIG_KEY}"]


def _acl_ports(ports: list[int]) -> str:
    return ",".join(str(port) for port in ports) or "*"


def egress_acl(who: str, sources: str, policy: EgressSpec) -> list[str]:
    """3proxy ACL lines for `spec.egress`, first match wins (3proxy matches IP targets on the resolved
    address): metadata refused, explicit allows, the denied ranges refused, public on allowPorts."""
    lines = [f"deny * * {','.join(METADATA_ADDRESSES)}"]
    lines += [f"allow {who} {sources} {rule.cidr} {_acl_ports(rule.ports)}" for rule in policy.allow]
    lines.append(f"deny * * {','.join(denied_ranges(4) + denied_ranges(6))}")
    if policy.allow_ports:
        lines.append(f"allow {who} {sources} * {_acl_ports(policy.allow_ports)}")
    return lines


def config(settings: ProxySettings, *, listen_port: int) -> str:
    creds, ranges = settings.credentials, ",".join(settings.allowed_source_ranges) or "*"
    lines = ["nscache 65536", "timeouts 1 5 30 60 180 1800 15 60", "log", "maxconn 200"]
    if creds:
        lines += [f"users {creds.username}:CL:{creds.password}", "auth strong"]
    else:
        lines += ["auth iponly"]
    lines += egress_acl(creds.username if creds else "*", ranges, settings.egress)
    service = "socks" if settings.protocol == "socks5" else "proxy -a"
    lines += ["deny *", f"{service} -n -p{listen_port}"]
    return "\n".join(line.rstrip() for line in lines) + "\n"
