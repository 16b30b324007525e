"""Stack inspection for people: what each stack holds, how its last operation went, its outputs, its state.

Read-only, built on `Engine.list_stack_names/info/outputs/export`. Secret outputs (the proxies'
credentials) are masked as "[secret]" unless the caller asks for them. The models are pydantic so that the
API's `/v1/stacks` serves exactly what the CLI prints; `StackInspector` here satisfies the protocol that
`service/api/deps.py` declares (`list_stacks()`, `get_stack(name)`).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from automation.engine import Engine, StackInfo

MASK = "[secret]"
PROVIDER_CONFIG = "proxy-operator:provider"
# Resource type prefixes -> provider type, when the state does not carry the catalogue entry.
TYPE_PREFIXES = {
    "kubernetes:": "kubernetes",
    "gcp:": "gcp",
    "libvirt:": "kvm",  # pulumi-libvirt, in stacks made before the kvm program's own providers
    "pulumi-python:dynamic/proxy-operator:Libvirt": "kvm",
}


class StackNotFoundError(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.message = f"no stack {name!r}: `proxy-operator stacks list` shows the stacks there are"

    def __str__(self) -> str:
        return self.message


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class StackSummary(_Wire):
    name: str
    provider: str = Field(description="The catalogue entry this stack provisions (one stack per entry).")
    provider_type: str | None = Field(None, description="kubernetes, gcp, kvm or local, read from state.")
    proxies: list[str] = Field(description="Keys (namespace/name) of the proxies in the stack's state.")
    resource_count: int
    applied_hash: str | None = Field(None, description="Spec hash of the last successful up.")
    last_operation: str | None = None
    last_result: str | None = None
    last_started: datetime | None = None
    last_finished: datetime | None = None
    last_changes: dict[str, int] = Field(
        default_factory=dict,
        description="The last update's resource counts by operation, from its summary: {create: 2, same: 5}.",
    )


class StackDetail(StackSummary):
    outputs: dict[str, Any] = Field(default_factory=dict, description=f"Secret outputs read {MASK!r}.")


class StackOutputs(_Wire):
    name: str
    outputs: dict[str, Any]
    secret_keys: list[str] = Field(description="Outputs that are secret (masked unless asked for).")


@dataclass
class StackInspector:
    engine: Engine
    parallel: int = 4  # stacks read at once by list_stacks (each read is a few CLI calls)

    def list_stacks(self) -> list[StackSummary]:
        names = self.engine.list_stack_names()
        if not names:
            return []
        with ThreadPoolExecutor(max_workers=min(self.parallel, len(names))) as pool:
            details = list(pool.map(self._detail, names))
        return [StackSummary.model_validate(detail.model_dump(exclude={"outputs"})) for detail in details]

    def get_stack(self, name: str) -> StackDetail | None:
        """One stack with its outputs masked; None when there is no such stack (the API answers 404)."""
        if not self.engine.exists(name):
            return None
        return self._detail(name)

    def outputs(self, name: str, *, show_secrets: bool = False) -> StackOutputs:
        self._require(name)
        raw = self.engine.outputs(name)
        return StackOutputs(
            name=name,
            outputs=_masked(raw, show_secrets=show_secrets),
            secret_keys=sorted(key for key, (_value, secret) in raw.items() if secret),
        )

    def export(self, name: str, *, show_secrets: bool = False) -> dict[str, Any]:
        """The raw state (`pulumi stack export`): secret values stay ciphertext unless asked for."""
        self._require(name)
        return self.engine.export(name) if show_secrets else self.engine.export_stored(name)

    def _require(self, name: str) -> None:
        if not self.engine.exists(name):
            raise StackNotFoundError(name)

    def _detail(self, name: str) -> StackDetail:
        info = self.engine.info(name)
        deployment = self.engine.export_stored(name).get("deployment") or {}
        return detail_from(info, provider_type=provider_type(deployment))


def detail_from(info: StackInfo, *, provider_type: str | None) -> StackDetail:
    return StackDetail(
        name=info.name,
        provider=info.name,
        provider_type=provider_type,
        proxies=info.proxies,
        resource_count=info.resource_count,
        applied_hash=info.applied_hash or None,
        last_operation=info.last_operation,
        last_result=info.last_result,
        last_started=info.last_started,
        last_finished=info.last_finished,
        last_changes=info.last_changes,
        outputs=_masked(info.outputs, show_secrets=False),
    )


def provider_type(deployment: dict[str, Any]) -> str | None:
    """The catalogue entry's type: from the stack config that the providers carry, else by resource type."""
    resources = deployment.get("resources") or []
    for resource in resources:
        entry = (resource.get("inputs") or {}).get(PROVIDER_CONFIG)
        if isinstance(entry, str):
            try:
                found = json.loads(entry).get("type")
            except (ValueError, AttributeError):
                continue
            if isinstance(found, str):
                return found
    for resource in resources:
        kind = str(resource.get("type", ""))
        for prefix, name in TYPE_PREFIXES.items():
            if kind.startswith(prefix):
                return name
        if kind.endswith(":LocalProxy"):
            return "local"
    return None


def _masked(outputs: dict[str, tuple[Any, bool]], *, show_secrets: bool) -> dict[str, Any]:
    return {key: value if show_secrets or not secret else MASK for key, (value, secret) in outputs.items()}
