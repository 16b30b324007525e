"""The service's probe must pass every proxy's egress policy: an explicit allow for the probe's echo endpoint.

The probe URL reaches the program as stack config `proxy-operator:probeUrl` or, failing that, the program's
environment `PROXY_OPERATOR_PROBE_URL`. Its host is resolved here, when the program runs (a name such as the
service's in-cluster DNS name becomes its addresses), and each address is allowed on the probe's port only.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from stacks.models import EgressRule, EgressSpec

PROBE_URL_ENV = "PROXY_OPERATOR_PROBE_URL"


def _addresses(host: str, port: int) -> list[str]:
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []  # the probe cannot reach a name nobody resolves either; nothing to allow
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class ProbePods:
    """The service's own pods in a cluster (stack config `proxy-operator:probePods`, JSON). A proxy pod's
    probe goes to the service's ClusterIP, but a NetworkPolicy judges the packet after the Service's DNAT:
    its destination is then a service pod on the listen port, which only a pod selector can name."""

    namespace: str
    labels: dict[str, str]
    port: int

    @classmethod
    def parse(cls, text: str) -> ProbePods | None:
        """From the stack config's JSON; "" (not in a cluster): None."""
        if not text:
            return None
        raw = json.loads(text)
        return cls(namespace=str(raw["namespace"]), labels=dict(raw["labels"]), port=int(raw["port"]))


def probe_rules(probe_url: str | None) -> list[EgressRule]:
    """One rule per address of the probe URL's host, on its port (none without a URL)."""
    if not probe_url:
        return []
    parts = urlsplit(probe_url)
    if not parts.hostname:
        return []
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return [EgressRule(cidr=address, ports=[port]) for address in _addresses(parts.hostname, port)]


def with_rules(policy: EgressSpec, rules: list[EgressRule]) -> EgressSpec:
    """`policy` plus `rules` not already in it (the program's allows come after the Proxy's own)."""
    extra = [rule for rule in rules if rule not in policy.allow]
    return policy.model_copy(update={"allow": [*policy.allow, *extra]}) if extra else policy
