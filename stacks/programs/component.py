"""The per-proxy component, the program's view of one proxy, and the names and labels that mark ownership.

Every resource of a proxy sits under one `ComponentResource` named `ns/name`, so the automation layer can
remove or forget one proxy's subtree on its own. Labels (or metadata) on every cloud resource name the
managing service, the installation, the proxy and the stack, so orphans can be found with a label query
(`stacks/marks.py`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pydantic import ValidationError

from stacks.marks import (
    GCP_MANAGED_BY,
    K8S_MANAGED_BY,
    LABEL_PREFIX,
    MANAGED_BY,
    gcp_installation_labels,
    gcp_value,
    kubernetes_installation_labels,
    label_value,
    short_hash,
)
from stacks.models import ProxySpec

COMPONENT_TYPE = "proxy-operator:index:Proxy"


class InvalidInputError(ValueError):
    """Input that no retry can fix (the automation layer reads "InvalidInput" as permanent)."""


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str


@dataclass(frozen=True)
class ProgramProxy:
    """One entry of the `proxy-operator:proxies` config list."""

    namespace: str
    name: str
    spec: ProxySpec
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_config(cls, item: Mapping[str, Any]) -> ProgramProxy:
        key = f"{item.get('namespace')}/{item.get('name')}"
        try:
            spec = ProxySpec.model_validate(item["spec"])
        except (KeyError, ValidationError) as exc:
            raise InvalidInputError(f"{key}: invalid spec in proxy-operator:proxies: {exc}") from exc
        return cls(
            namespace=item["namespace"], name=item["name"], labels=dict(item.get("labels") or {}), spec=spec
        )


@dataclass(frozen=True)
class ProxyEndpoint:
    """What the stack exports for one proxy: where to reach it and which instance serves it."""

    host: pulumi.Input[str]
    port: int
    protocol: str
    instance_id: pulumi.Input[str]

    def to_output(self) -> pulumi.Output[dict[str, Any]]:
        return pulumi.Output.all(self.host, self.instance_id).apply(
            lambda values: {
                "host": values[0],
                "port": self.port,
                "protocol": self.protocol,
                "instanceId": values[1],
            }
        )


@dataclass(frozen=True)
class ControlledEndpoint(ProxyEndpoint):
    """An endpoint plus where its lease-user control channel listens (a unix socket path for `local`,
    `tcp://NAME:PORT` for proxy pods; None: no lease users), exported as `control`."""

    control: pulumi.Input[str | None] = None

    def to_output(self) -> pulumi.Output[dict[str, Any]]:
        return pulumi.Output.all(super().to_output(), self.control).apply(
            lambda values: {**values[0], "control": values[1]}
        )


class ProxyComponent(pulumi.ComponentResource):
    """Parent of every resource of one proxy (type `proxy-operator:index:Proxy`, named `ns/name`)."""

    def __init__(self, key: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(COMPONENT_TYPE, key, None, opts)


def child_opts(parent: pulumi.Resource, **kwargs: Any) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(parent=parent, **kwargs)


def physical_name(prefix: str, proxy: ProgramProxy, max_length: int = 63) -> str:
    """A DNS-1035 label (lowercase, starts with a letter) unique per proxy; long keys get a hash suffix."""
    base = re.sub(r"[^a-z0-9-]+", "-", f"{prefix}-{proxy.namespace}-{proxy.name}".lower()).strip("-")
    if len(base) <= max_length:
        return base
    suffix = short_hash(proxy.key)
    return f"{base[: max_length - len(suffix) - 1].rstrip('-')}-{suffix}"


def kubernetes_labels(proxy: ProgramProxy, stack: str) -> dict[str, str]:
    """The labels of a proxy's pods (and of its objects, which add `kubernetes_object_labels`)."""
    return {
        K8S_MANAGED_BY: MANAGED_BY,
        "app.kubernetes.io/name": "proxy",
        f"{LABEL_PREFIX}/proxy-namespace": proxy.namespace,
        f"{LABEL_PREFIX}/proxy-name": label_value(proxy.name),
        f"{LABEL_PREFIX}/stack": label_value(stack),
    }


def kubernetes_object_labels(proxy: ProgramProxy, stack: str, installation: str | None) -> dict[str, str]:
    """The objects' own labels: the pods' plus the installation (kept off the pod template, so adding it
    changes the objects in place and rolls no pod)."""
    return kubernetes_labels(proxy, stack) | kubernetes_installation_labels(installation)


def gcp_labels(proxy: ProgramProxy, stack: str, installation: str | None = None) -> dict[str, str]:
    """GCP label values: lowercase letters, digits, `-` and `_`, at most 63 characters."""
    return {
        GCP_MANAGED_BY: MANAGED_BY,
        "proxy": gcp_value(f"{proxy.namespace}_{proxy.name}"),
        "stack": gcp_value(stack),
    } | gcp_installation_labels(installation)
