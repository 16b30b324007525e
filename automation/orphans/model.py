"""An orphan: a resource carrying our marks and this installation's id that no stack's state holds."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LocalProcess:
    pid: int
    start_time: int
    config: Path

    @property
    def instance_id(self) -> str:
        return f"{self.pid}-{self.start_time}"


@dataclass(frozen=True)
class Orphan:
    provider: str  # the catalogue entry whose mark it carries
    kind: str  # "process", a Kubernetes kind, "instance"/"firewall" (gcp), "domain" (kvm)
    id: str  # the id the stack's state would hold for it
    detail: str
    process: LocalProcess | None = None
    name: str = ""  # its name where it lives
    location: str = ""  # its namespace (kubernetes), zone or "global" (gcp), host name (kvm)


def state_ids(deployments: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """(resource type, id) of every resource in the given stack states (`pulumi stack export` documents)."""
    found: set[tuple[str, str]] = set()
    for exported in deployments:
        deployment = exported.get("deployment") or {}
        for resource in deployment.get("resources") or ():
            if resource.get("id"):
                found.add((str(resource.get("type")), str(resource["id"])))
    return found
