"""Shared pieces of the wire models: camelCase config, name and CIDR types, address helpers."""

from __future__ import annotations

import functools
import ipaddress
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

API_GROUP: Final = "crawl.example.com"
API_VERSION: Final = "crawl.example.com/v1alpha1"
KIND: Final = "Proxy"
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
PROVIDER_TYPES = ("kubernetes", "gcp", "kvm", "local")
OPEN_PROXY_MESSAGE = (
    "auth.mode is 'none' and allowedSourceRanges lets the whole internet in: open proxies get abused within "
    "hours; set auth.mode to 'generated' or 'secret', or narrow allowedSourceRanges to the crawlers' CIDRs"
)
# The service's own image, which also runs the project's forward proxy (`proxy-operator-forward-proxy`):
# proxy pods run the daemon of the same release as the program that writes its configuration. Keep the tag
# equal to pyproject.toml's version and deploy/deployment.yaml's image (tests/test_dockerfile.py checks).
# A Proxy naming a 3proxy image (the default before issue 19) keeps 3proxy (stacks/programs/threeproxy.py).
OPERATOR_IMAGE_REPOSITORY = "ghcr.io/example/proxy-operator"
DEFAULT_KUBERNETES_IMAGE = f"{OPERATOR_IMAGE_REPOSITORY}:0.1.0"
DEFAULT_GCP_IMAGE = "debian-cloud/debian-12"
DEFAULT_KVM_BASE_IMAGE = "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-generic-amd64.qcow2"

Dns1123Label = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS1123_LABEL)]
# The CRD's check for a CIDR (the model parses it properly); bounded so the API server can cost CEL rules.
CIDR_PATTERN = r"^([0-9]{1,3}(\.[0-9]{1,3}){3}|[0-9a-fA-F:.]*:[0-9a-fA-F:.]*)(/[0-9]{1,3})?$"
Cidr = Annotated[str, Field(max_length=43, json_schema_extra={"pattern": CIDR_PATTERN})]


class WireModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


def ip_address_text(value: str) -> str:
    """The canonical text of an IP address, or a ValueError saying how to write one."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"'{value}' is not an IP address: use one such as 127.0.0.1") from None


@functools.lru_cache(maxsize=1024)  # a fleet repeats a few ranges; a packed proxy is validated again often
def normalise_cidr(value: str) -> str:
    """`10.1.2.3/8` -> `10.0.0.0/8`, a bare address -> a /32 or /128. Cached: parsing the same ranges
    again was half of a stored proxy's validation (`resolve_stack`, 500 proxies at each drift check)."""
    try:
        return str(ipaddress.ip_network(value.strip(), strict=False))
    except ValueError:
        raise ValueError(f"'{value}' is not a CIDR: write it like 203.0.113.0/24 or 2001:db8::/32") from None


from stacks.models.no_auth import (  # noqa: E402, F401 (the models' vocabulary, kept importable here)
    DEFAULT_NO_AUTH_MIN_PREFIX,
    NO_AUTH_MAX_ITEMS,
    NO_AUTH_MAX_PREFIX_ENV,
    no_auth_min_prefix,
)


def source_coverage(ranges: list[str]) -> tuple[int, int]:
    """How many IPv4 and IPv6 addresses the ranges cover together (overlaps counted once); loopback ranges
    count for nothing (only this machine is there)."""
    networks = [ipaddress.ip_network(r) for r in ranges if not ipaddress.ip_network(r).is_loopback]
    v4 = [n for n in networks if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in networks if isinstance(n, ipaddress.IPv6Network)]
    return (
        sum(n.num_addresses for n in ipaddress.collapse_addresses(v4)),
        sum(n.num_addresses for n in ipaddress.collapse_addresses(v6)),
    )


def too_wide_without_auth(ranges: list[str]) -> str | None:
    """Why these sources are too wide for a proxy without credentials, or None."""
    v4_prefix, v6_prefix = no_auth_min_prefix()
    v4, v6 = source_coverage(ranges)
    if v4 > 2 ** (32 - v4_prefix) or v6 > 2 ** (128 - v6_prefix):
        return (
            f"auth.mode is 'none' and allowedSourceRanges cover {v4} IPv4 and {v6} IPv6 addresses, more than "
            f"one /{v4_prefix} (IPv4) or /{v6_prefix} (IPv6) allows without credentials: set auth.mode to "
            "'generated' or 'secret', or narrow the ranges to the crawlers' CIDRs"
        )
    return None


def is_open_to_all(ranges: list[str]) -> bool:
    """No ranges means open; a /0 range (IPv4 or IPv6) is the whole internet."""
    return not ranges or any(ipaddress.ip_network(r).prefixlen == 0 for r in ranges)
