"""The shared vocabulary: a `Proxy` object (crawl.example.com/v1alpha1) and the provider catalogue.

pydantic v2 at the edge: camelCase on the wire, snake_case in Python, unknown spec fields refused so a typo is
an error instead of a silently ignored setting. `stacks/crd.py` generates the CRD from these models.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.alias_generators import to_camel

API_GROUP = "crawl.example.com"
API_VERSION = f"{API_GROUP}/v1alpha1"
KIND = "Proxy"
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
PROVIDER_TYPES = ("kubernetes", "gcp", "kvm", "local")
OPEN_PROXY_MESSAGE = (
    "auth.mode is 'none' and allowedSourceRanges lets the whole internet in: open proxies get abused within "
    "hours; set auth.mode to 'generated' or 'secret', or narrow allowedSourceRanges to the crawlers' CIDRs"
)
# 3proxy in a small image, configured by env: PROXY_LOGIN, PROXY_PASSWORD, PROXY_PORT (HTTP), SOCKS_PORT.
DEFAULT_KUBERNETES_IMAGE = "ghcr.io/tarampampam/3proxy:1.9.1"
DEFAULT_GCP_IMAGE = "debian-cloud/debian-12"
DEFAULT_KVM_BASE_IMAGE = "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-generic-amd64.qcow2"

Dns1123Label = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS1123_LABEL)]
# The CRD's check for a CIDR (the model parses it properly); bounded so the API server can cost CEL rules.
CIDR_PATTERN = r"^([0-9]{1,3}(\.[0-9]{1,3}){3}|[0-9a-fA-F:.]*:[0-9a-fA-F:.]*)(/[0-9]{1,3})?$"
Cidr = Annotated[str, Field(max_length=43, json_schema_extra={"pattern": CIDR_PATTERN})]


class WireModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Protocol(StrEnum):
    http = "http"  # plain HTTP forwarding and CONNECT tunnels
    socks5 = "socks5"


class SecretRef(WireModel):
    name: Dns1123Label = Field(description="Secret holding the keys `username` and `password`.")
    namespace: Dns1123Label | None = Field(None, description="Defaults to the Proxy's namespace.")


class AuthSpec(WireModel):
    # CEL for the API server, mirroring `_secret_ref_matches_mode`.
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.mode != 'secret' || has(self.secretRef)",
                    "message": "auth.mode 'secret' needs auth.secretRef.name",
                },
                {
                    "rule": "!has(self.secretRef) || self.mode == 'secret'",
                    "message": "auth.secretRef is only read when auth.mode is 'secret'",
                },
            ]
        }
    )

    mode: Literal["generated", "secret", "none"] = Field(
        "generated", description="generated: the service makes credentials; secret: from secretRef; none."
    )
    secret_ref: SecretRef | None = Field(None, description="Required when mode is `secret`.")

    @model_validator(mode="after")
    def _secret_ref_matches_mode(self) -> AuthSpec:
        if self.mode == "secret" and self.secret_ref is None:
            raise ValueError(
                "auth.mode 'secret' needs auth.secretRef.name: name the Secret that holds "
                "`username` and `password`"
            )
        if self.mode != "secret" and self.secret_ref is not None:
            raise ValueError(
                f"auth.secretRef is only read when auth.mode is 'secret' (it is '{self.mode}'): "
                "set mode to 'secret' or remove secretRef"
            )
        return self


class KubernetesProxySpec(WireModel):
    image: str = Field(DEFAULT_KUBERNETES_IMAGE, min_length=1, description="Proxy container image.")
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    resources: dict[str, dict[str, str]] = Field(
        default_factory=lambda: {
            "requests": {"cpu": "50m", "memory": "32Mi"},
            "limits": {"cpu": "500m", "memory": "128Mi"},
        },
        description="Container resources: {requests: {cpu, memory}, limits: {cpu, memory}}.",
    )

    @field_validator("resources")
    @classmethod
    def _known_resource_keys(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        unknown = sorted(set(value) - {"requests", "limits"})
        if unknown:
            raise ValueError(f"unknown keys {unknown}: use only `requests` and `limits`")
        return value


class GcpProxySpec(WireModel):
    machine_type: str = Field("e2-micro", min_length=1)
    zone: str | None = Field(None, description="Defaults to the catalogue entry's zone.")
    preemptible: bool = False
    address_type: Literal["ephemeral", "static"] = "ephemeral"
    image: str = Field(DEFAULT_GCP_IMAGE, min_length=1, description="Boot image (family or self link).")


class KvmProxySpec(WireModel):
    host: Dns1123Label | None = Field(
        None, description="A host name of the kvm catalogue entry; default the first."
    )
    vcpus: int = Field(1, ge=1, le=64)
    memory_mib: int = Field(512, ge=256, le=262144)
    disk_gib: int = Field(10, ge=3, le=2048)


class LocalProxySpec(WireModel):
    bind_address: str = Field("127.0.0.1", description="Address the proxy process listens on.")

    @field_validator("bind_address")
    @classmethod
    def _ip_address(cls, value: str) -> str:
        return _ip_address(value)


def _ip_address(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"'{value}' is not an IP address: use one such as 127.0.0.1") from None


def normalise_cidr(value: str) -> str:
    """`10.1.2.3/8` -> `10.0.0.0/8`, a bare address -> a /32 or /128."""
    try:
        return str(ipaddress.ip_network(value.strip(), strict=False))
    except ValueError:
        raise ValueError(f"'{value}' is not a CIDR: write it like 203.0.113.0/24 or 2001:db8::/32") from None


def is_open_to_all(ranges: list[str]) -> bool:
    """No ranges means open; a /0 range (IPv4 or IPv6) is the whole internet."""
    return not ranges or any(ipaddress.ip_network(r).prefixlen == 0 for r in ranges)


class ProxySpec(WireModel):
    # CEL for the API server, mirroring the validators below (defaults are applied before these run).
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.auth.mode != 'none' || (has(self.allowedSourceRanges) && "
                    "size(self.allowedSourceRanges) > 0 && "
                    "!self.allowedSourceRanges.exists(r, r.endsWith('/0')))",
                    "message": OPEN_PROXY_MESSAGE,
                },
                {
                    "rule": "[has(self.kubernetes), has(self.gcp), has(self.kvm), has(self.local)]"
                    ".filter(x, x).size() <= 1",
                    "message": "set at most one provider-type block",
                },
            ]
        }
    )

    provider: Dns1123Label = Field(description="Name of a provider instance in the catalogue.")
    port: int = Field(3128, ge=1, le=65535, description="Port the proxy listens on and publishes.")
    protocol: Protocol = Protocol.http
    pool: str | None = Field(None, min_length=1, max_length=63, description="Discovery pool; selects only.")
    auth: AuthSpec = Field(default_factory=AuthSpec, json_schema_extra={"default": {}})
    allowed_source_ranges: list[Cidr] = Field(
        default_factory=list,
        validate_default=True,
        max_length=256,
        description="CIDRs that may connect; empty means all.",
    )
    kubernetes: KubernetesProxySpec | None = None
    gcp: GcpProxySpec | None = None
    kvm: KvmProxySpec | None = None
    local: LocalProxySpec | None = None

    @field_validator("allowed_source_ranges")
    @classmethod
    def _cidrs_and_not_open(cls, value: list[str], info: ValidationInfo) -> list[str]:
        ranges = list(dict.fromkeys(normalise_cidr(item) for item in value))
        auth = info.data.get("auth")
        if isinstance(auth, AuthSpec) and auth.mode == "none" and is_open_to_all(ranges):
            raise ValueError(OPEN_PROXY_MESSAGE)
        return ranges

    @model_validator(mode="after")
    def _one_block(self) -> ProxySpec:
        present = self.blocks_present()
        if len(present) > 1:
            raise ValueError(
                f"set at most one provider-type block, found {', '.join(present)}: keep the one "
                "matching the provider's type"
            )
        return self

    def blocks_present(self) -> list[str]:
        return [name for name in PROVIDER_TYPES if getattr(self, name) is not None]

    def block_for(self, provider_type: str) -> Any:
        """This proxy's settings for `provider_type`, defaults when the block is absent."""
        defaults = {
            "kubernetes": KubernetesProxySpec,
            "gcp": GcpProxySpec,
            "kvm": KvmProxySpec,
            "local": LocalProxySpec,
        }
        return getattr(self, provider_type) or defaults[provider_type]()


class Condition(WireModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None
    observed_generation: int | None = None


class Address(WireModel):
    host: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)


class LastOperation(WireModel):
    model_config = ConfigDict(extra="ignore")

    type: str = Field(description="up, destroy, refresh, forget or preview.")
    result: str = Field(description="succeeded, failed or in-progress.")
    started_at: datetime | None = None
    finished_at: datetime | None = None
    message: str = ""


class ProxyStatus(WireModel):
    model_config = ConfigDict(extra="ignore")

    phase: str | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    address: Address | None = None
    egress_ip: str | None = Field(None, alias="egressIP")
    observed_spec_hash: str | None = None
    stack: str | None = None
    last_operation: LastOperation | None = None


class ObjectMeta(WireModel):
    # Kubernetes adds many fields (managedFields, ...); keep those we use and ignore the rest.
    model_config = ConfigDict(extra="ignore")

    name: Dns1123Label
    namespace: Dns1123Label = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    finalizers: list[str] = Field(default_factory=list)


class Proxy(WireModel):
    api_version: Literal["crawl.example.com/v1alpha1"] = API_VERSION
    kind: Literal["Proxy"] = KIND
    metadata: ObjectMeta
    spec: ProxySpec
    status: ProxyStatus = Field(default_factory=ProxyStatus)

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"


# --- the provider catalogue -------------------------------------------------------------------------------


class ProviderBase(WireModel):
    name: Dns1123Label = Field(description="Unique name; Proxies select it with spec.provider.")
    drift_policy: Literal["correct", "detect"] = Field(
        "detect", description="detect: report drift only; correct: refresh and up to restore the spec."
    )


class KubernetesProvider(ProviderBase):
    type: Literal["kubernetes"]
    namespace: Dns1123Label = Field("proxies", description="Namespace the proxy Deployments run in.")
    kubeconfig_secret: Dns1123Label | None = Field(
        None, description="Secret with key `kubeconfig` for another cluster; absent = this cluster."
    )


class GcpProvider(ProviderBase):
    type: Literal["gcp"]
    project: str = Field(pattern=r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
    region: str = Field(pattern=r"^[a-z]+-[a-z]+[0-9]+$")
    zone: str = Field(pattern=r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
    network: str = "default"
    credentials_secret: Dns1123Label | None = Field(
        None, description="Secret with key `credentials.json` (service-account key); absent = ambient."
    )

    @model_validator(mode="after")
    def _zone_in_region(self) -> GcpProvider:
        if not self.zone.startswith(f"{self.region}-"):
            raise ValueError(
                f"zone '{self.zone}' is not in region '{self.region}': pick a zone such as {self.region}-b"
            )
        return self


KVM_URI_SHAPE = "qemu+ssh://user@host[:port]/system"


class KvmHost(WireModel):
    name: Dns1123Label
    uri: str = Field(description=f"libvirt URI over SSH, {KVM_URI_SHAPE}.")
    pool: str | None = Field(None, description="Storage pool; defaults to the entry's pool.")
    network: str | None = Field(None, description="libvirt network; defaults to the entry's network.")

    @field_validator("uri")
    @classmethod
    def _qemu_ssh(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme != "qemu+ssh" or not parts.username or not parts.hostname:
            raise ValueError(f"'{value}' is not a libvirt URI over SSH: write it as {KVM_URI_SHAPE}")
        if parts.path not in ("/system", "/session"):
            raise ValueError(f"'{value}' must end in /system (or /session): write it as {KVM_URI_SHAPE}")
        if re.search(r"(^|&)no_verify=1", parts.query):
            raise ValueError("no_verify=1 skips the host key check: remove it and provide known_hosts")
        return value


class KvmProvider(ProviderBase):
    type: Literal["kvm"]
    hosts: list[KvmHost] = Field(min_length=1)
    pool: str = "default"
    network: str = "default"
    ssh_secret: Dns1123Label = Field(
        "kvm-ssh", description="Secret with keys `id_ed25519` (private key) and `known_hosts`."
    )
    base_image: str = Field(DEFAULT_KVM_BASE_IMAGE, min_length=1, description="Cloud image URL or path.")

    @model_validator(mode="after")
    def _unique_hosts_and_defaults(self) -> KvmProvider:
        names = [host.name for host in self.hosts]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"host names must be unique, repeated: {', '.join(duplicates)}: rename one")
        for host in self.hosts:  # fill inherited settings so readers see one value, and hashes agree
            host.pool = host.pool or self.pool
            host.network = host.network or self.network
        return self

    def host(self, name: str | None) -> KvmHost | None:
        """The named host, the first one when `name` is None, None when the catalogue lacks it."""
        if name is None:
            return self.hosts[0]
        return next((host for host in self.hosts if host.name == name), None)


class LocalProvider(ProviderBase):
    type: Literal["local"]
    bind_address: str = Field("127.0.0.1", description="Listen address for proxies without a `local` block.")
    state_dir: str | None = Field(None, description="Where process state and logs go; default a temp folder.")

    @field_validator("bind_address")
    @classmethod
    def _ip_address(cls, value: str) -> str:
        return _ip_address(value)


ProviderEntry = Annotated[
    KubernetesProvider | GcpProvider | KvmProvider | LocalProvider, Field(discriminator="type")
]


class ProviderCatalogue(WireModel):
    providers: list[ProviderEntry] = Field(default_factory=list)

    @field_validator("providers")
    @classmethod
    def _unique_names(cls, value: list[ProviderEntry]) -> list[ProviderEntry]:
        first: dict[str, int] = {}
        for index, entry in enumerate(value):
            if entry.name in first:
                raise ValueError(
                    f"providers[{first[entry.name]}] and providers[{index}] are both named "
                    f"'{entry.name}': names must be unique, rename one"
                )
            first[entry.name] = index
        return value

    def get(self, name: str) -> ProviderEntry | None:
        return next((entry for entry in self.providers if entry.name == name), None)

    def names(self) -> list[str]:
        return [entry.name for entry in self.providers]
