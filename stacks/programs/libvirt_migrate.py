"""Moving a kvm stack made with pulumi-libvirt onto the program's own libvirt resources, in its state only:
the same VMs and volumes, now held by `LibvirtBaseVolume`, `LibvirtVolume`, `LibvirtCloudInitDisk` and
`LibvirtDomain`, so the next `up` replaces nothing. No plugin is needed: the state is JSON.

    pulumi stack export --file old.json
    python -m stacks.programs.libvirt_migrate < old.json > new.json
    pulumi stack import --file new.json
    pulumi preview          # expect no replace; a description may update in place

Each pulumi-libvirt resource keeps its URN's name and parent and gets the new type; its inputs become the
props the program now sends (host URI and SSH folder from its libvirt provider's URI), its outputs those
props plus what the provider read (`path`, `address`, `uuid`), its id stays (a volume's key, a domain's
UUID; a cloud-init disk's `path;uuid` becomes its path). The `pulumi:providers:libvirt` resources go. Every
reference (dependencies, property dependencies, parents) follows the new URNs. Run it on a stack no
operation holds (the service stopped, or the stack's lock free).
"""

from __future__ import annotations

import json
import sys
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pulumi.dynamic.dynamic import serialize_provider

from stacks.programs.libvirt_cidata import CloudInitDiskProvider
from stacks.programs.libvirt_conn import SSH_PARAMETERS
from stacks.programs.libvirt_domain import LEASE_TIMEOUT_SECONDS, DomainProvider
from stacks.programs.libvirt_volumes import BaseVolumeProvider, ProxyVolumeProvider

OLD_PROVIDER = "pulumi:providers:libvirt"
OLD_VOLUME, OLD_DISK, OLD_DOMAIN = (
    "libvirt:index/volume:Volume",
    "libvirt:index/cloudInitDisk:CloudInitDisk",
    "libvirt:index/domain:Domain",
)
NEW = "pulumi-python:dynamic/proxy-operator:"
PYTHON_PROVIDER = "::pulumi:providers:pulumi-python::"


class MigrationError(ValueError):
    """The state is not one this migration knows how to read; nothing was changed."""


def host_of(provider_uri: str) -> tuple[str, str]:
    """(the catalogue URI, the SSH folder) from the URI the old program gave its libvirt provider."""
    parts = urlsplit(provider_uri)
    query = parse_qsl(parts.query)
    keyfile = dict(query).get("keyfile", "")
    kept = [(key, value) for key, value in query if key not in SSH_PARAMETERS]
    uri = urlunsplit(parts._replace(query=urlencode(kept, safe="/")))
    return uri, keyfile.rpartition("/")[0] or "/etc/proxy-operator/kvm"


def _where(resource: dict[str, Any], hosts: dict[str, tuple[str, str]]) -> dict[str, Any]:
    reference = resource.get("provider", "")
    urn = reference.rpartition("::")[0]
    if urn not in hosts:
        raise MigrationError(f"{resource['urn']}: its libvirt provider {reference} is not in the state")
    uri, ssh_dir = hosts[urn]
    return {"uri": uri, "sshDir": ssh_dir}


def _volume(old: dict[str, Any], where: dict[str, Any], rid: str) -> tuple[str, Any, dict[str, Any]]:
    base = {**where, "pool": old.get("pool") or "default", "name": old["name"]}
    if old.get("baseVolumeId"):
        props = {**base, "basePath": old["baseVolumeId"], "sizeBytes": int(old["size"])}
        return "LibvirtVolume", ProxyVolumeProvider(), {**props, "path": rid}
    return "LibvirtBaseVolume", BaseVolumeProvider(), {**base, "source": old.get("source"), "path": rid}


def _disk(old: dict[str, Any], where: dict[str, Any], rid: str) -> tuple[str, Any, dict[str, Any]]:
    props = {
        **where,
        "pool": old.get("pool") or "default",
        "name": old["name"],
        "userData": old.get("userData"),
        "metaData": old.get("metaData"),
        "networkConfig": old.get("networkConfig") or None,
        "path": rid.split(";")[0],
    }
    return "LibvirtCloudInitDisk", CloudInitDiskProvider(), props


def _domain(old: dict[str, Any], where: dict[str, Any], sizes: dict[str, int]) -> dict[str, Any]:
    nic = (old.get("networkInterfaces") or [{}])[0]
    disk = (old.get("disks") or [{}])[0].get("volumeId", "")
    return {
        **where,
        "name": old["name"],
        "description": old.get("description") or "",
        "domainType": old.get("type") or "kvm",
        "vcpus": int(old.get("vcpu") or 1),
        "memoryMib": int(old.get("memory") or 512),
        "diskPath": disk,
        "diskSize": sizes.get(disk, 0),
        "cidataPath": (old.get("cloudinit") or "").split(";")[0],
        "network": nic.get("networkName") or "default",
        "leaseTimeout": LEASE_TIMEOUT_SECONDS,
    }


def _new_urn(urn: str, new_type: str) -> str:
    head, _, name = urn.rpartition("::")
    chain_head, dollar, _old_type = head.rpartition("$")
    if not dollar:  # no parent: `...::project::type`
        chain_head, _, _old_type = head.rpartition("::")
        return f"{chain_head}::{new_type}::{name}"
    return f"{chain_head}${new_type}::{name}"


def _python_provider(resources: list[dict[str, Any]]) -> str:
    for resource in resources:
        if PYTHON_PROVIDER in resource.get("provider", ""):
            return str(resource["provider"])
    raise MigrationError("no dynamic resource in the state: this is not a stack of the kvm program")


def _translated(
    resource: dict[str, Any], *, hosts: dict[str, Any], sizes: dict[str, int], python: str
) -> dict[str, Any]:
    old, rid, where = resource.get("outputs") or {}, str(resource.get("id", "")), _where(resource, hosts)
    if resource["type"] == OLD_VOLUME:
        name, provider, props = _volume(old, where, rid)
    elif resource["type"] == OLD_DISK:
        name, provider, props = _disk(old, where, rid)
    else:
        nic = (old.get("networkInterfaces") or [{}])[0]
        name, provider, props = "LibvirtDomain", DomainProvider(), _domain(old, where, sizes)
        address = (nic.get("addresses") or [None])[0]
        props = {**props, "address": address, "uuid": rid, "running": True}
    serialized = serialize_provider(provider)
    inputs = {key: value for key, value in props.items() if key not in ("path", "address", "uuid")}
    new_type = f"{NEW}{name}"
    return {
        **resource,
        "urn": _new_urn(resource["urn"], new_type),
        "type": new_type,
        "provider": python,
        "inputs": {**inputs, "__provider": serialized},
        "outputs": {**props, "__provider": serialized},
    }


def _rewired(resource: dict[str, Any], urns: dict[str, str]) -> dict[str, Any]:
    out = dict(resource)
    out["dependencies"] = [urns.get(u, u) for u in resource.get("dependencies") or []]
    if resource.get("propertyDependencies"):
        out["propertyDependencies"] = {
            key: [urns.get(u, u) for u in deps] for key, deps in resource["propertyDependencies"].items()
        }
    for key in ("parent", "deletedWith"):
        if resource.get(key):
            out[key] = urns.get(resource[key], resource[key])
    return out


def migrate(deployment: dict[str, Any]) -> dict[str, Any]:
    """The deployment (`pulumi stack export`'s `deployment`) with pulumi-libvirt's resources moved over."""
    resources: list[dict[str, Any]] = deployment.get("resources") or []
    hosts = {
        r["urn"]: host_of((r.get("inputs") or {}).get("uri", ""))
        for r in resources
        if r["type"] == OLD_PROVIDER
    }
    sizes = {
        str(r.get("id")): int((r.get("outputs") or {}).get("size") or 0)
        for r in resources
        if r["type"] == OLD_VOLUME
    }
    python = _python_provider(resources)
    kept, urns = [], {}
    for resource in resources:
        if resource["type"] == OLD_PROVIDER:
            continue
        if resource["type"] in (OLD_VOLUME, OLD_DISK, OLD_DOMAIN):
            new = _translated(resource, hosts=hosts, sizes=sizes, python=python)
            urns[resource["urn"]] = new["urn"]
            kept.append(new)
        else:
            kept.append(resource)
    return {**deployment, "resources": [_rewired(r, urns) for r in kept]}


def main() -> None:
    exported = json.load(sys.stdin)
    try:
        exported["deployment"] = migrate(exported["deployment"])
    except (MigrationError, KeyError) as exc:
        sys.exit(f"proxy-operator: the state was left as it was: {exc}")
    json.dump(exported, sys.stdout, indent=2)


if __name__ == "__main__":
    main()
