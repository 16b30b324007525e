"""The shared vocabulary: a `Proxy` object (crawl.example.com/v1alpha1) and the provider catalogue.

pydantic v2 at the edge: camelCase on the wire, snake_case in Python, unknown spec fields refused so a typo is
an error instead of a silently ignored setting. `stacks/crd.py` generates the CRD from these models. Import
from `stacks.models`; the submodules are an implementation detail.
"""

from stacks.models.blocks import GcpProxySpec, KubernetesProxySpec, KvmProxySpec, LocalProxySpec
from stacks.models.egress import DEFAULT_ALLOW_PORTS, EgressRule, EgressSpec
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
    "PROVIDER_TYPES",
    "Address",
    "AuthSpec",
    "Cidr",
    "Condition",
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
    "Protocol",
    "ProviderBase",
    "ProviderCatalogue",
    "ProviderEntry",
    "Proxy",
    "ProxySpec",
    "ProxyStatus",
    "SecretRef",
    "WireModel",
    "duplicate_names_message",
    "ip_address_text",
    "is_open_to_all",
    "normalise_cidr",
]
