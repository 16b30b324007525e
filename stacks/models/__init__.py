"""The shared vocabulary: a `Proxy` object (crawl.example.com/v1alpha1) and the provider catalogue.

pydantic v2 at the edge: camelCase on the wire, snake_case in Python, unknown spec fields refused so a typo is
an error instead of a silently ignored setting. `stacks/crd.py` generates the CRD from these models. Import
from `stacks.models`; the submodules are an implementation detail.

The submodules load on first use (PEP 562): a process that needs only pydantic-free parts (the engine host:
`stacks.models.conditions` through `automation.errors`) loads no model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stacks.models.blocks import GcpProxySpec, KubernetesProxySpec, KvmProxySpec, LocalProxySpec
    from stacks.models.egress import DEFAULT_ALLOW_PORTS, EgressRule, EgressSpec
    from stacks.models.packed import PackedProxy
    from stacks.models.pool import (
        POOL_KIND,
        BanRule,
        DemandScaling,
        PoolPlacement,
        PoolProxySpec,
        PoolRotation,
        PoolTemplate,
        ProxyPool,
        ProxyPoolSpec,
        ProxyPoolStatus,
    )
    from stacks.models.providers import (
        KVM_URI_SHAPE,
        GcpProvider,
        KubernetesProvider,
        KvmHost,
        KvmProvider,
        LocalProvider,
        ProviderBase,
        ProviderCatalogue,
        ProviderEntry,
        duplicate_names_message,
    )
    from stacks.models.proxy import AuthSpec, ObjectMeta, Protocol, Proxy, ProxySpec, SecretRef
    from stacks.models.status import Address, Condition, LastOperation, ProxyStatus
    from stacks.models.wire import (
        API_GROUP,
        API_VERSION,
        CIDR_PATTERN,
        DEFAULT_GCP_IMAGE,
        DEFAULT_KUBERNETES_IMAGE,
        DEFAULT_KVM_BASE_IMAGE,
        DNS1123_LABEL,
        KIND,
        OPEN_PROXY_MESSAGE,
        PROVIDER_TYPES,
        Cidr,
        Dns1123Label,
        WireModel,
        ip_address_text,
        is_open_to_all,
        normalise_cidr,
    )

_WHERE = {
    "API_GROUP": "stacks.models.wire",
    "API_VERSION": "stacks.models.wire",
    "CIDR_PATTERN": "stacks.models.wire",
    "DEFAULT_ALLOW_PORTS": "stacks.models.egress",
    "DEFAULT_GCP_IMAGE": "stacks.models.wire",
    "DEFAULT_KUBERNETES_IMAGE": "stacks.models.wire",
    "DEFAULT_KVM_BASE_IMAGE": "stacks.models.wire",
    "DNS1123_LABEL": "stacks.models.wire",
    "KIND": "stacks.models.wire",
    "KVM_URI_SHAPE": "stacks.models.providers",
    "OPEN_PROXY_MESSAGE": "stacks.models.wire",
    "POOL_KIND": "stacks.models.pool",
    "PROVIDER_TYPES": "stacks.models.wire",
    "Address": "stacks.models.status",
    "AuthSpec": "stacks.models.proxy",
    "BanRule": "stacks.models.pool",
    "Cidr": "stacks.models.wire",
    "Condition": "stacks.models.status",
    "DemandScaling": "stacks.models.pool",
    "Dns1123Label": "stacks.models.wire",
    "EgressRule": "stacks.models.egress",
    "EgressSpec": "stacks.models.egress",
    "GcpProvider": "stacks.models.providers",
    "GcpProxySpec": "stacks.models.blocks",
    "KubernetesProvider": "stacks.models.providers",
    "KubernetesProxySpec": "stacks.models.blocks",
    "KvmHost": "stacks.models.providers",
    "KvmProvider": "stacks.models.providers",
    "KvmProxySpec": "stacks.models.blocks",
    "LastOperation": "stacks.models.status",
    "LocalProvider": "stacks.models.providers",
    "LocalProxySpec": "stacks.models.blocks",
    "ObjectMeta": "stacks.models.proxy",
    "PackedProxy": "stacks.models.packed",
    "PoolPlacement": "stacks.models.pool",
    "PoolProxySpec": "stacks.models.pool",
    "PoolRotation": "stacks.models.pool",
    "PoolTemplate": "stacks.models.pool",
    "Protocol": "stacks.models.proxy",
    "ProviderBase": "stacks.models.providers",
    "ProviderCatalogue": "stacks.models.providers",
    "ProviderEntry": "stacks.models.providers",
    "Proxy": "stacks.models.proxy",
    "ProxyPool": "stacks.models.pool",
    "ProxyPoolSpec": "stacks.models.pool",
    "ProxyPoolStatus": "stacks.models.pool",
    "ProxySpec": "stacks.models.proxy",
    "ProxyStatus": "stacks.models.status",
    "SecretRef": "stacks.models.proxy",
    "WireModel": "stacks.models.wire",
    "duplicate_names_message": "stacks.models.providers",
    "ip_address_text": "stacks.models.wire",
    "is_open_to_all": "stacks.models.wire",
    "normalise_cidr": "stacks.models.wire",
}

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "CIDR_PATTERN",
    "DEFAULT_ALLOW_PORTS",
    "DEFAULT_GCP_IMAGE",
    "DEFAULT_KUBERNETES_IMAGE",
    "DEFAULT_KVM_BASE_IMAGE",
    "DNS1123_LABEL",
    "KIND",
    "KVM_URI_SHAPE",
    "OPEN_PROXY_MESSAGE",
    "POOL_KIND",
    "PROVIDER_TYPES",
    "Address",
    "AuthSpec",
    "BanRule",
    "Cidr",
    "Condition",
    "DemandScaling",
    "Dns1123Label",
    "EgressRule",
    "EgressSpec",
    "GcpProvider",
    "GcpProxySpec",
    "KubernetesProvider",
    "KubernetesProxySpec",
    "KvmHost",
    "KvmProvider",
    "KvmProxySpec",
    "LastOperation",
    "LocalProvider",
    "LocalProxySpec",
    "ObjectMeta",
    "PackedProxy",
    "PoolPlacement",
    "PoolProxySpec",
    "PoolRotation",
    "PoolTemplate",
    "Protocol",
    "ProviderBase",
    "ProviderCatalogue",
    "ProviderEntry",
    "Proxy",
    "ProxyPool",
    "ProxyPoolSpec",
    "ProxyPoolStatus",
    "ProxySpec",
    "ProxyStatus",
    "SecretRef",
    "WireModel",
    "duplicate_names_message",
    "ip_address_text",
    "is_open_to_all",
    "normalise_cidr",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later look-ups are plain
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
