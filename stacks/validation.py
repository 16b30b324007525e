"""Checks that need more than one object: a Proxy against the catalogue, Proxies against each other.

Single-object rules (ranges, names, open proxies, secretRef) live in the models; these need the catalogue or
the whole set. `proxy_problems` is what a reconciler calls for one Proxy; `check_manifests` runs everything
over a loaded directory.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from stacks.manifests import Located, ManifestSet
from stacks.models import (
    GcpProvider,
    KvmProvider,
    LocalProvider,
    ProviderCatalogue,
    ProviderEntry,
    Proxy,
)
from stacks.models.proxy import LOCAL_NO_AUTH_MESSAGE
from stacks.problems import Problem


@dataclass(frozen=True)
class FieldProblem:
    """A problem inside one object: the field path (wire names) and the message."""

    path: str
    message: str


def proxy_problems(proxy: Proxy, catalogue: ProviderCatalogue) -> list[FieldProblem]:
    """What is wrong with `proxy` given the catalogue: unknown provider, wrong block, unknown KVM host."""
    entry = catalogue.get(proxy.spec.provider)
    if entry is None:
        known = ", ".join(catalogue.names()) or "none"
        return [
            FieldProblem(
                "spec.provider",
                f"no provider named '{proxy.spec.provider}' in the catalogue "
                f"(known: {known}): fix the name or add an entry to the catalogue",
            )
        ]
    problems = [
        FieldProblem(
            f"spec.{block}",
            f"provider '{entry.name}' is of type {entry.type}, this block is for "
            f"{block}: move the settings to spec.{entry.type} or remove spec.{block}",
        )
        for block in proxy.spec.blocks_present()
        if block != entry.type
    ]
    if isinstance(entry, KvmProvider):
        problems += _kvm_host_problems(proxy, entry)
    if isinstance(entry, GcpProvider) and proxy.spec.gcp and proxy.spec.gcp.zone:
        problems += _gcp_zone_problems(proxy.spec.gcp.zone, entry)
    return problems + _exposure_problems(proxy, entry)


def _exposure_problems(proxy: Proxy, entry: ProviderEntry) -> list[FieldProblem]:
    """Sources that would open a proxy to the internet, where only the catalogue entry tells."""
    spec = proxy.spec
    if isinstance(entry, GcpProvider) and not spec.allowed_source_ranges:
        message = (
            "a gcp proxy needs allowedSourceRanges: its firewall rule would otherwise admit the whole "
            "internet; list the crawlers' CIDRs"
        )
        return [FieldProblem("spec.allowedSourceRanges", message)]
    if not isinstance(entry, LocalProvider) or spec.auth.mode != "none" or spec.local is not None:
        return []
    if not ipaddress.ip_address(entry.bind_address).is_loopback:
        message = LOCAL_NO_AUTH_MESSAGE.format(bind=entry.bind_address) + " (from the catalogue entry)"
        return [FieldProblem("spec.auth.mode", message)]
    return []


def _gcp_zone_problems(zone: str, entry: GcpProvider) -> list[FieldProblem]:
    # The static address and the subnetwork are regional: a zone elsewhere cannot use them.
    if zone.startswith(f"{entry.region}-"):
        return []
    return [
        FieldProblem(
            "spec.gcp.zone",
            f"zone '{zone}' is outside region '{entry.region}' of provider "
            f"'{entry.name}': use a zone of {entry.region} or a provider entry for that region",
        )
    ]


def _kvm_host_problems(proxy: Proxy, entry: KvmProvider) -> list[FieldProblem]:
    host = proxy.spec.kvm.host if proxy.spec.kvm else None
    if host is None or entry.host(host) is not None:
        return []
    hosts = ", ".join(h.name for h in entry.hosts)
    return [
        FieldProblem(
            "spec.kvm.host",
            f"host '{host}' is not in provider '{entry.name}' (hosts: {hosts}): "
            "use one of them or add the host to the catalogue",
        )
    ]


def check_manifests(manifests: ManifestSet) -> list[Problem]:
    """Load problems plus every cross-object check, in file order."""
    problems = list(manifests.problems) + _catalogue_count(manifests)
    catalogue = manifests.catalogue
    if catalogue is not None:
        for located in manifests.proxies:
            problems += [_at(located, item) for item in proxy_problems(located.obj, catalogue)]
        problems += local_port_clashes(manifests.proxies, catalogue)
    problems += duplicate_keys(manifests.proxies)
    return sorted(problems, key=lambda p: (p.file, p.document if p.document is not None else -1, p.line or 0))


def duplicate_keys(proxies: Sequence[Located[Proxy]]) -> list[Problem]:
    first: dict[str, Located[Proxy]] = {}
    problems = []
    for located in proxies:
        earlier = first.setdefault(located.obj.key, located)
        if earlier is not located:
            where = f"{earlier.source.file} (document {earlier.source.document + 1})"
            problems.append(
                _at(
                    located,
                    FieldProblem(
                        "metadata.name",
                        f"Proxy {located.obj.key} is also defined in {where}: rename one or delete the copy",
                    ),
                )
            )
    return problems


def local_port_clashes(proxies: Sequence[Located[Proxy]], catalogue: ProviderCatalogue) -> list[Problem]:
    """Two `local` proxies cannot listen on the same address and port of this machine."""
    by_port: dict[int, list[tuple[str, Located[Proxy]]]] = {}
    problems = []
    for located in proxies:
        entry = catalogue.get(located.obj.spec.provider)
        if not isinstance(entry, LocalProvider):
            continue
        spec = located.obj.spec
        address = spec.local.bind_address if spec.local else entry.bind_address
        taken = by_port.setdefault(spec.port, [])
        other = next((earlier for bound, earlier in taken if _overlap(bound, address)), None)
        if other is not None:
            message = (
                f"port {spec.port} on {address} is also used by Proxy {other.obj.key}: pick another port"
            )
            problems.append(_at(located, FieldProblem("spec.port", message)))
        taken.append((address, located))
    return problems


def _overlap(first: str, second: str) -> bool:
    # A wildcard address takes the port on every address of its family.
    a, b = ipaddress.ip_address(first), ipaddress.ip_address(second)
    return a == b or (a.version == b.version and (a.is_unspecified or b.is_unspecified))


def _catalogue_count(manifests: ManifestSet) -> list[Problem]:
    if not manifests.catalogues and manifests.broken_catalogues:
        return []  # its own problems are listed; Proxies cannot be checked against it
    if not manifests.catalogues:
        message = (
            "no provider catalogue found: add a YAML file with a top-level `providers:` list (or a "
            "ConfigMap with the key providers.yaml)"
        )
        return [
            Problem(
                file=manifests.root or "(manifests)",
                document=None,
                line=None,
                obj="catalogue",
                path="",
                message=message,
            )
        ]
    first = manifests.catalogues[0].source
    return [
        Problem(
            file=extra.source.file,
            document=extra.source.document,
            line=extra.source.line,
            obj="catalogue",
            path="",
            message=f"a second catalogue (the first is in {first.file}): keep exactly one",
        )
        for extra in manifests.catalogues[1:]
    ]


def _at(located: Located[Proxy], problem: FieldProblem) -> Problem:
    source = located.source
    parts = tuple(problem.path.split("."))
    return Problem(
        file=source.file,
        document=source.document,
        line=source.line_of(parts),
        obj=f"Proxy {located.obj.key}",
        path=problem.path,
        message=problem.message,
    )
