"""What `validate` checks of each ProxyPool beyond its schema: every placement against the catalogue, and the
child it would make there against the rules of a Proxy (the provider-type block, KVM hosts, ...)."""

from __future__ import annotations

from service.pools.expand import child_proxy
from stacks.manifests import Located, ManifestSet
from stacks.models import POOL_KIND, PoolPlacement, ProviderCatalogue, ProxyPool
from stacks.problems import Problem
from stacks.validation import FieldProblem, proxy_problems


def pool_problems(manifests: ManifestSet) -> list[Problem]:
    catalogue = manifests.catalogue
    if catalogue is None:
        return []
    problems: list[Problem] = []
    for located in manifests.pools:
        for index, placement in enumerate(located.obj.spec.placement):
            for item in placement_problems(located.obj, placement, catalogue=catalogue):
                problems.append(_at(located, index, item))
    return problems


def placement_problems(
    pool: ProxyPool, placement: PoolPlacement, *, catalogue: ProviderCatalogue
) -> list[FieldProblem]:
    entry = catalogue.get(placement.provider)
    if entry is None:
        known = ", ".join(catalogue.names()) or "none"
        message = f"no provider named '{placement.provider}' in the catalogue (known: {known})"
        return [FieldProblem("provider", message)]
    found: list[FieldProblem] = []
    if entry.type == "local" and placement.port_base is None and pool.spec.replicas > 1:
        message = "local children share one host: set portBase so each child gets its own port"
        found.append(FieldProblem("portBase", message))
    sample = child_proxy(
        pool,
        placement,
        name=f"{pool.metadata.name}-x",
        born=0,
        port=pool.spec.template.spec.port,
        replaces=None,
    )
    for problem in proxy_problems(sample, catalogue):
        found.append(FieldProblem(f"template.spec.{problem.path.removeprefix('spec.')}", problem.message))
    return found


def _at(located: Located[ProxyPool], index: int, problem: FieldProblem) -> Problem:
    parts: tuple[str | int, ...] = tuple(problem.path.split("."))
    path = ("spec", *parts) if problem.path.startswith("template.") else ("spec", "placement", index, *parts)
    meta = located.obj.metadata
    return Problem(
        file=located.source.file,
        document=located.source.document,
        line=located.source.line_of(path),
        obj=f"{POOL_KIND} {meta.namespace}/{meta.name}",
        path=".".join(str(p) for p in path),
        message=problem.message,
    )
