"""Which live Proxy object a board key names: what the status writer, the events and the credentials need.

The Kubernetes source answers `lookup(key) -> ProxyRef | None` from its watch cache (None: not known, or
gone); the writers never list Proxies themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stacks.crd import PLURAL, VERSION
from stacks.models import API_GROUP, API_VERSION, KIND

__all__ = ["Lookup", "ProxyRef"]


@dataclass(frozen=True)
class ProxyRef:
    namespace: str
    name: str
    uid: str
    generation: int | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def path(self, subresource: str = "") -> str:
        base = f"/apis/{API_GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}/{self.name}"
        return f"{base}/{subresource}" if subresource else base

    def object_reference(self) -> dict[str, Any]:
        """The Proxy as an Event's involvedObject / regarding."""
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
        }

    def owner_reference(self) -> dict[str, Any]:
        """The Proxy as the controlling owner of an object in its namespace (garbage-collected with it).
        blockOwnerDeletion stays false: it would need `update` on proxies/finalizers for nothing we need."""
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": False,
        }


Lookup = Callable[[str], ProxyRef | None]
