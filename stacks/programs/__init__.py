"""The Pulumi programs: one builder per provider type, all called through `build_stack`.

Provider modules are imported lazily, so a `local` stack never loads pulumi_gcp (hundreds of MiB).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi

from stacks.programs.component import ProgramProxy
from stacks.programs.context import ProgramSettings, proxy_context
from stacks.programs.probe_allow import probe_rules

BUILDERS = {
    "kubernetes": "stacks.programs.kubernetes",
    "gcp": "stacks.programs.gcp",
    "kvm": "stacks.programs.kvm",
    "local": "stacks.programs.local",
}


@dataclass(frozen=True)
class StackOutputs:
    proxies: pulumi.Output[dict[str, Any]]
    credentials: pulumi.Output[dict[str, Any]]


def _dict_output(items: Mapping[str, pulumi.Output[Any]]) -> pulumi.Output[dict[str, Any]]:
    keys = list(items)
    return pulumi.Output.all(*items.values()).apply(lambda values: dict(zip(keys, values, strict=True)))


def build_stack(
    *,
    entry: Any,
    proxies: Sequence[ProgramProxy],
    given_credentials: Mapping[str, Any],
    settings: ProgramSettings,
) -> StackOutputs:
    """Declare every proxy's resources for the catalogue entry; return the stack outputs."""
    builder = importlib.import_module(BUILDERS[entry.type])
    probe = probe_rules(settings.probe_url)
    contexts = [proxy_context(proxy, given_credentials, probe) for proxy in proxies]
    endpoints = builder.build(entry, contexts, settings)
    credentials = {ctx.proxy.key: ctx.credentials.to_output() for ctx in contexts if ctx.credentials}
    return StackOutputs(
        proxies=_dict_output({key: endpoint.to_output() for key, endpoint in endpoints.items()}),
        credentials=pulumi.Output.secret(_dict_output(credentials)),
    )
