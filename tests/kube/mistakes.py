"""Proxies that must be refused (the mistakes `proxy-operator validate` refuses) and edge cases both accept.

Each mistake names what refuses it in the apiserver: `cel` (an x-kubernetes-validations rule of the CRD),
`schema` (the CRD's OpenAPI schema: types, enums, patterns, bounds, required and unknown fields) or `builtin`
(the apiserver's own object-name rules, whatever the CRD says). The tests check that attribution by applying
each mistake to copies of the CRD without its CEL rules and without its schema.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Literal

GROUP = "crawl.example.com"
Refuser = Literal["cel", "schema", "builtin"]
OPEN_PROXY = "open proxies get abused"
# A server-side apply refuses a field the schema does not declare, whatever fieldValidation says, with a 500
# "failed to create typed patch object"; a create or update prunes it unless fieldValidation=Strict.
UNDECLARED = "field not declared in schema"


def proxy(
    spec: dict[str, Any] | None = None, *, name: str = "mistake", group: str = GROUP, **patch: Any
) -> dict[str, Any]:
    """A valid loopback Proxy with `spec` merged into its spec (a None value removes that key)."""
    document = {
        "apiVersion": f"{group}/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"provider": "local", "port": 18081, "allowedSourceRanges": ["127.0.0.0/8"]},
    }
    merged: dict[str, Any] = merge(document, {"spec": spec or {}, **patch})
    return merged


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class Mistake:
    id: str
    refused_by: Refuser
    says: str  # a fragment of the apiserver's message
    spec: dict[str, Any] = field(default_factory=dict)
    name: str = "mistake"
    drop_spec: bool = False
    status: int = 422  # a server-side apply of an undeclared field fails with 500 (see UNDECLARED)

    def document(self, group: str = GROUP) -> dict[str, Any]:
        document = proxy(self.spec, name=self.name, group=group)
        if self.drop_spec:
            del document["spec"]
        return document


def none_auth(*ranges: str) -> dict[str, Any]:
    return {"auth": {"mode": "none"}, "allowedSourceRanges": list(ranges) or None}


MISTAKES = [
    Mistake("port-0", "schema", "spec.port", {"port": 0}),
    Mistake("port-65536", "schema", "spec.port", {"port": 65536}),
    Mistake("provider-not-dns-label", "schema", "spec.provider", {"provider": "Local_1"}),
    Mistake("provider-leading-dash", "schema", "spec.provider", {"provider": "-web"}),
    Mistake("provider-trailing-dash", "schema", "spec.provider", {"provider": "web-"}),
    Mistake("provider-64-chars", "schema", "spec.provider", {"provider": "a" * 64}),
    Mistake("provider-empty", "schema", "spec.provider", {"provider": ""}),
    Mistake("provider-missing", "schema", "spec.provider: Required value", {"provider": None}),
    Mistake("spec-missing", "schema", "spec: Required value", drop_spec=True),
    Mistake("name-64-chars", "schema", "metadata.name", name="a" * 64),
    Mistake("name-with-dot", "schema", "metadata.name", name="web.1"),
    Mistake("name-uppercase", "builtin", "Invalid value", name="Web"),
    Mistake("name-underscore", "builtin", "Invalid value", name="web_1"),
    Mistake("protocol-ftp", "schema", "spec.protocol", {"protocol": "ftp"}),
    Mistake("auth-mode-unknown", "schema", "spec.auth.mode", {"auth": {"mode": "open"}}),
    Mistake("open-proxy-no-ranges", "cel", OPEN_PROXY, none_auth()),
    Mistake("open-proxy-everyone", "cel", OPEN_PROXY, none_auth("0.0.0.0/0")),
    Mistake("open-proxy-ipv6-everyone", "cel", OPEN_PROXY, none_auth("10.1.0.0/16", "::/0")),
    Mistake("open-proxy-odd-zero", "cel", OPEN_PROXY, none_auth("1.2.3.4/0")),
    Mistake("open-proxy-two-halves", "cel", "takes at most 32", none_auth("0.0.0.0/1", "128.0.0.0/1")),
    Mistake("open-proxy-wide-ipv6", "cel", "takes at most 32", none_auth("2001:db8::/32")),
    Mistake(
        "open-proxy-many-ranges",
        "cel",
        "takes at most 32",
        none_auth(*(f"203.0.{i}.0/28" for i in range(33))),
    ),
    Mistake(
        "no-auth-local-wildcard",
        "cel",
        "needs a loopback",
        {**none_auth("127.0.0.1/32"), "local": {"bindAddress": "0.0.0.0"}},
    ),
    Mistake(
        "egress-cidr-bad", "cel", "egress.allow[].cidr", {"egress": {"allow": [{"cidr": "10.0.0.0/33"}]}}
    ),
    Mistake("secret-without-ref", "cel", "needs auth.secretRef.name", {"auth": {"mode": "secret"}}),
    Mistake("ref-without-secret-mode", "cel", "only read when", {"auth": {"secretRef": {"name": "creds"}}}),
    Mistake(
        "ref-name-invalid",
        "schema",
        "secretRef.name",
        {"auth": {"mode": "secret", "secretRef": {"name": "Creds"}}},
    ),
    Mistake(
        "ref-name-missing",
        "schema",
        "secretRef.name: Required value",
        {"auth": {"mode": "secret", "secretRef": {}}},
    ),
    Mistake("cidr-garbage", "schema", "allowedSourceRanges[0]", {"allowedSourceRanges": ["not-a-cidr"]}),
    Mistake("cidr-prefix-33", "cel", "not a CIDR", {"allowedSourceRanges": ["10.0.0.0/33"]}),
    Mistake("cidr-octet-999", "cel", "not a CIDR", {"allowedSourceRanges": ["999.0.0.0/8"]}),
    Mistake(
        "cidr-too-many",
        "schema",
        "Too many",
        {"allowedSourceRanges": [f"10.0.{i // 250}.{i % 250}" for i in range(257)]},
    ),
    Mistake("unknown-field", "schema", f".spec.prot: {UNDECLARED}", {"prot": 3128}, status=500),
    Mistake(
        "unknown-auth-field", "schema", f".spec.auth.user: {UNDECLARED}", {"auth": {"user": "x"}}, status=500
    ),
    Mistake(
        "unknown-block-field", "schema", f".spec.kvm.cpus: {UNDECLARED}", {"kvm": {"cpus": 2}}, status=500
    ),
    Mistake("two-provider-blocks", "cel", "at most one provider-type block", {"gcp": {}, "local": {}}),
    Mistake("kvm-vcpus-0", "schema", "spec.kvm.vcpus", {"kvm": {"vcpus": 0}}),
    Mistake("kvm-memory-too-small", "schema", "spec.kvm.memoryMib", {"kvm": {"memoryMib": 100}}),
    Mistake("kvm-disk-too-small", "schema", "spec.kvm.diskGib", {"kvm": {"diskGib": 1}}),
    Mistake("kvm-host-not-dns-label", "schema", "spec.kvm.host", {"kvm": {"host": "KVM_1"}}),
    Mistake(
        "kubernetes-external-name",
        "schema",
        "spec.kubernetes.serviceType",
        {"kubernetes": {"serviceType": "ExternalName"}},
    ),
    Mistake("kubernetes-empty-image", "schema", "spec.kubernetes.image", {"kubernetes": {"image": ""}}),
    Mistake(
        "kubernetes-resources-key",
        "cel",
        "use only `requests` and `limits`",
        {"kubernetes": {"resources": {"request": {"cpu": "1"}}}},
    ),
    Mistake("gcp-address-type", "schema", "spec.gcp.addressType", {"gcp": {"addressType": "reserved"}}),
    Mistake("gcp-empty-machine-type", "schema", "spec.gcp.machineType", {"gcp": {"machineType": ""}}),
    Mistake("local-bind-hostname", "cel", "not an IP address", {"local": {"bindAddress": "localhost"}}),
    Mistake("pool-empty", "schema", "spec.pool", {"pool": ""}),
    Mistake("pool-64-chars", "schema", "spec.pool", {"pool": "p" * 64}),
]

# What the model accepts and a too-strict rule could refuse: both must accept each.
ACCEPTED = {
    "bare-address-range": proxy({"allowedSourceRanges": ["192.0.2.7", "2001:db8::1"]}),
    "host-bits-set": proxy({"allowedSourceRanges": ["10.1.2.3/8", "2001:db8::1/32"]}),
    "open-ranges-with-credentials": proxy({"allowedSourceRanges": ["0.0.0.0/0", "::/0"]}),
    "no-auth-narrow-ranges": proxy(none_auth("10.1.0.0/16", "2001:db8::/48")),
    "secret-with-ref": proxy(
        {"auth": {"mode": "secret", "secretRef": {"name": "creds", "namespace": "ops"}}}
    ),
    "port-bounds": proxy({"port": 65535, "protocol": "socks5"}),
    "name-63-chars": proxy(name="a" * 63),
    "ipv6-bind": proxy({"local": {"bindAddress": "::1"}}),
    "kubernetes-requests-only": proxy({"kubernetes": {"resources": {"requests": {"cpu": "1"}}}}),
    "every-kvm-field": proxy(
        {"provider": "kvm-home", "kvm": {"host": "kvm1", "vcpus": 64, "memoryMib": 256, "diskGib": 3}}
    ),
    "pool-63-chars": proxy({"pool": "p" * 63}),
}
