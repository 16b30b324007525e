"""The provider-type blocks of a Proxy spec: settings that only one provider type reads."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from stacks.models.wire import (
    DEFAULT_GCP_IMAGE,
    DEFAULT_KUBERNETES_IMAGE,
    Dns1123Label,
    WireModel,
    ip_address_text,
)


class KubernetesProxySpec(WireModel):
    image: str = Field(default=DEFAULT_KUBERNETES_IMAGE, min_length=1, description="Proxy container image.")
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
    machine_type: str = Field(default="e2-micro", min_length=1)
    zone: str | None = Field(default=None, description="Defaults to the catalogue entry's zone.")
    preemptible: bool = False
    address_type: Literal["ephemeral", "static"] = "ephemeral"
    image: str = Field(
        default=DEFAULT_GCP_IMAGE, min_length=1, description="Boot image (family or self link)."
    )


class KvmProxySpec(WireModel):
    host: Dns1123Label | None = Field(
        default=None, description="A host name of the kvm catalogue entry; default the first."
    )
    vcpus: int = Field(default=1, ge=1, le=64)
    memory_mib: int = Field(default=512, ge=256, le=262144)
    disk_gib: int = Field(default=10, ge=3, le=2048)


class LocalProxySpec(WireModel):
    bind_address: str = Field(default="127.0.0.1", description="Address the proxy process listens on.")

    @field_validator("bind_address")
    @classmethod
    def _ip_address(cls, value: str) -> str:
        return ip_address_text(value)
