"""The Proxy object (crawl.example.com/v1alpha1): metadata, spec and status."""

from __future__ import annotations

import ipaddress
import sys
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from stacks.models.blocks import GcpProxySpec, KubernetesProxySpec, KvmProxySpec, LocalProxySpec
from stacks.models.egress import EgressSpec
from stacks.models.status import ProxyStatus
from stacks.models.wire import (
    API_VERSION,
    DEFAULT_NO_AUTH_MIN_PREFIX,
    KIND,
    NO_AUTH_MAX_ITEMS,
    OPEN_PROXY_MESSAGE,
    PROVIDER_TYPES,
    Cidr,
    Dns1123Label,
    WireModel,
    is_open_to_all,
    normalise_cidr,
    too_wide_without_auth,
)

NO_AUTH_CEL_MESSAGE = (
    f"auth.mode 'none' takes at most {NO_AUTH_MAX_ITEMS} allowedSourceRanges, each at least a "
    f"/{DEFAULT_NO_AUTH_MIN_PREFIX[0]} (IPv4) or /{DEFAULT_NO_AUTH_MIN_PREFIX[1]} (IPv6); the service also "
    "bounds their sum"
)
LOCAL_NO_AUTH_MESSAGE = (
    "auth.mode is 'none' and local.bindAddress is {bind}: a local proxy without credentials may listen on "
    "loopback only; set auth.mode to 'generated' or bind to 127.0.0.1"
)


class Protocol(StrEnum):
    http = "http"  # plain HTTP forwarding and CONNECT tunnels
    socks5 = "socks5"


class SecretRef(WireModel):
    name: Dns1123Label = Field(description="Secret holding the keys `username` and `password`.")
    namespace: Dns1123Label | None = Field(default=None, description="Defaults to the Proxy's namespace.")


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
        default="generated",
        description="generated: the service makes credentials; secret: from secretRef; none.",
    )
    secret_ref: SecretRef | None = Field(default=None, description="Required when mode is `secret`.")

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
                    "rule": "self.auth.mode != 'none' || !has(self.allowedSourceRanges) || ("
                    f"size(self.allowedSourceRanges) <= {NO_AUTH_MAX_ITEMS} && "
                    # /0 is the open-proxy rule's to refuse: each refusal comes from one rule.
                    "self.allowedSourceRanges.all(r, !isCIDR(r) || cidr(r).ip().isLoopback() || "
                    "cidr(r).prefixLength() == 0 || "
                    "cidr(r).prefixLength() >= "
                    f"(cidr(r).ip().family() == 4 ? {DEFAULT_NO_AUTH_MIN_PREFIX[0]} : "
                    f"{DEFAULT_NO_AUTH_MIN_PREFIX[1]})))",
                    "message": NO_AUTH_CEL_MESSAGE,
                },
                {
                    "rule": "self.auth.mode != 'none' || !has(self.local) || "
                    "ip(self.local.bindAddress).isLoopback()",
                    "message": "auth.mode 'none' needs a loopback local.bindAddress",
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
    port: int = Field(default=3128, ge=1, le=65535, description="Port the proxy listens on and publishes.")
    protocol: Protocol = Protocol.http
    pool: str | None = Field(
        default=None, min_length=1, max_length=63, description="Discovery pool; selects only."
    )
    auth: AuthSpec = Field(
        default_factory=lambda: AuthSpec.model_validate({}), json_schema_extra={"default": {}}
    )
    allowed_source_ranges: list[Cidr] = Field(
        default_factory=list,
        validate_default=True,
        max_length=256,
        description="CIDRs that may connect; empty means all.",
    )
    egress: EgressSpec = Field(
        default_factory=lambda: EgressSpec.model_validate({}),
        json_schema_extra={"default": {}},
        description="Where the proxy may connect to; default public addresses on ports 80 and 443.",
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
        if isinstance(auth, AuthSpec) and auth.mode == "none":
            if is_open_to_all(ranges):
                raise ValueError(OPEN_PROXY_MESSAGE)
            if len(ranges) > NO_AUTH_MAX_ITEMS:
                raise ValueError(
                    f"auth.mode is 'none' with {len(ranges)} allowedSourceRanges: at most "
                    f"{NO_AUTH_MAX_ITEMS} without credentials; set credentials or merge the ranges"
                )
            too_wide = too_wide_without_auth(ranges)
            if too_wide:
                raise ValueError(too_wide)
        return ranges

    @model_validator(mode="after")
    def _local_without_auth_on_loopback(self) -> ProxySpec:
        if (
            self.auth.mode == "none"
            and self.local
            and not ipaddress.ip_address(self.local.bind_address).is_loopback
        ):
            raise ValueError(LOCAL_NO_AUTH_MESSAGE.format(bind=self.local.bind_address))
        return self

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
    status: ProxyStatus = Field(default_factory=lambda: ProxyStatus.model_validate({}))

    @property
    def key(self) -> str:
        # Interned: the service keys a dozen maps by it, for each of 10,000 Proxies; one string each.
        return sys.intern(f"{self.metadata.namespace}/{self.metadata.name}")
