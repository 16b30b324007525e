"""The state migration from pulumi-libvirt (`stacks/programs/libvirt_migrate.py`) on a state written the way
pulumi-libvirt 0.5.4 wrote it (its types, ids and camelCase outputs, a provider resource per host with the
old program's URI), built here from the inputs the program declares today (run under Pulumi mocks: the same
user-data, names and sizes the old program sent). After the migration, each new resource's provider `diff`
against what the program now declares finds no change: the next `up` replaces no VM. The engine itself is
not run here (no KVM host needed); the diff is the very call it makes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pulumi import automation as auto
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime import rpc

from stacks.models import KvmProvider
from stacks.programs.context import ProgramSettings
from stacks.programs.credentials import SuffixProvider
from stacks.programs.libvirt_cidata import CloudInitDiskProvider
from stacks.programs.libvirt_domain import DomainProvider
from stacks.programs.libvirt_migrate import host_of, migrate
from stacks.programs.libvirt_volumes import BaseVolumeProvider, ProxyVolumeProvider
from tests.conftest import ROOT as REPO
from tests.conftest import PulumiEnv
from tests.stacks.program_harness import RecordingMocks, install, proxy, run

NEW = "pulumi-python:dynamic/proxy-operator:"
STACK, PROJECT = "kvm-home", "proxy-operator"
ROOT = f"urn:pulumi:{STACK}::{PROJECT}"
PY = f"{ROOT}::pulumi:providers:pulumi-python::default::8d1e"
LIBVIRT = f"{ROOT}::pulumi:providers:libvirt::kvm-kvm-home-hv1"
IMAGES = "/var/lib/libvirt/images"
UUID = "0c2c5f9e-1d1b-4d7e-8f1a-2b9b1c6a7e11"
OLD_URI = (
    "qemu+ssh://virt@hv1.lan:2222/system?keyfile=%2Fetc%2Fproxy-operator%2Fkvm%2Fid_ed25519"
    "&knownhosts=%2Fetc%2Fproxy-operator%2Fkvm%2Fknown_hosts&known_hosts_verify=normal"
)
ENTRY = KvmProvider.model_validate(
    {
        "name": "kvm-home",
        "type": "kvm",
        "hosts": [{"name": "hv1", "uri": "qemu+ssh://virt@hv1.lan:2222/system"}],
    }
)
SETTINGS = ProgramSettings(stack=STACK, root_dir="/tmp", kvm_ssh_dir="/etc/proxy-operator/kvm")
SPEC: dict[str, Any] = {
    "provider": "kvm-home",
    "auth": {"mode": "none"},
    "allowedSourceRanges": ["192.168.1.0/24"],
}
PROVIDERS = {
    "LibvirtBaseVolume": BaseVolumeProvider(),
    "LibvirtVolume": ProxyVolumeProvider(),
    "LibvirtCloudInitDisk": CloudInitDiskProvider(),
    "LibvirtDomain": DomainProvider(),
}


def _path(outputs: dict[str, Any]) -> dict[str, Any]:
    return {"path": f"{IMAGES}/{outputs['name']}"}


def _declared() -> dict[str, dict[str, Any]]:
    """What the program declares today for one proxy, by `type::name`."""
    mocks = RecordingMocks(
        computed={
            f"{NEW}LibvirtBaseVolume": _path,
            f"{NEW}LibvirtVolume": _path,
            f"{NEW}LibvirtCloudInitDisk": _path,
            f"{NEW}LibvirtDomain": lambda _: {"address": "192.168.122.50"},
            f"{NEW}StableSuffix": lambda _: {"suffix": "k3x9q2"},
        }
    )
    install(mocks, stack=STACK)
    run(entry=ENTRY, proxies=[proxy("a", **SPEC)], settings=SETTINGS)
    return {f"{r.typ}::{r.name}": {k: _plain(v) for k, v in r.inputs.items()} for r in mocks.resources}


def _plain(value: Any) -> Any:
    """A value as the engine hands it to a provider's diff (the mocks see `__provider` as a secret)."""
    return value["value"] if isinstance(value, dict) and rpc._special_sig_key in value else value


def _old(
    kind: str, name: str, rid: str, outputs: dict[str, Any], *, parent: str, deps: list[str]
) -> dict[str, Any]:
    chain = "proxy-operator:index:Proxy$" if parent.endswith("crawl/a") else ""
    return {
        "urn": f"{ROOT}::{chain}{kind}::{name}",
        "custom": True,
        "id": rid,
        "type": kind,
        "inputs": {k: v for k, v in outputs.items() if k not in ("xml",)},
        "outputs": outputs,
        "parent": parent,
        "provider": f"{LIBVIRT}::5a7b",
        "dependencies": deps,
        "propertyDependencies": {"x": deps},
    }


def _pulumi_libvirt_state(declared: dict[str, dict[str, Any]]) -> dict[str, Any]:
    base_in = declared[f"{NEW}LibvirtBaseVolume::base-hv1-default-debian-12-generic-amd64.qcow2"]
    disk_in = declared[f"{NEW}LibvirtCloudInitDisk::crawl/a"]
    domain_in = declared[f"{NEW}LibvirtDomain::crawl/a"]
    stack_urn, component = (
        f"{ROOT}::pulumi:pulumi:Stack::{PROJECT}-{STACK}",
        f"{ROOT}::proxy-operator:index:Proxy::crawl/a",
    )
    base_path, volume_path = f"{IMAGES}/{base_in['name']}", f"{IMAGES}/px-crawl-a.qcow2"
    iso_id = f"{IMAGES}/{disk_in['name']};4f0e"
    base = _old(
        "libvirt:index/volume:Volume",
        "base-hv1-default-debian-12-generic-amd64.qcow2",
        base_path,
        {
            "name": base_in["name"],
            "pool": "default",
            "source": ENTRY.base_image,
            "format": "qcow2",
            "size": 2 * 1024**3,
        },
        parent=stack_urn,
        deps=[
            f"{ROOT}::pulumi-python:dynamic/proxy-operator:StableSuffix::base-hv1-default-debian-12-generic-amd64.qcow2"
        ],
    )
    volume = _old(
        "libvirt:index/volume:Volume",
        "crawl/a",
        volume_path,
        {
            "name": "px-crawl-a.qcow2",
            "pool": "default",
            "baseVolumeId": base_path,
            "size": 10 * 1024**3,
            "format": "qcow2",
        },
        parent=component,
        deps=[base["urn"]],
    )
    disk = _old(
        "libvirt:index/cloudInitDisk:CloudInitDisk",
        "crawl/a",
        iso_id,
        {
            "name": disk_in["name"],
            "pool": "default",
            "userData": disk_in["userData"],
            "metaData": disk_in["metaData"],
            "networkConfig": "",
        },
        parent=component,
        deps=[],
    )
    nic = {
        "networkName": "default",
        "hostname": "px-crawl-a",
        "waitForLease": True,
        "addresses": ["192.168.122.50"],
    }
    domain = _old(
        "libvirt:index/domain:Domain",
        "crawl/a",
        UUID,
        {
            "name": "px-crawl-a",
            "description": domain_in["description"],
            "vcpu": 1,
            "memory": 512,
            "autostart": True,
            "cloudinit": iso_id,
            "disks": [{"volumeId": volume_path}],
            "networkInterfaces": [nic],
            "type": "kvm",
        },
        parent=component,
        deps=[volume["urn"], disk["urn"]],
    )
    suffix = {
        "urn": base["dependencies"][0],
        "custom": True,
        "id": "s1",
        "type": f"{NEW}StableSuffix",
        "provider": f"{PY}",
        "parent": stack_urn,
        "inputs": {
            "keeper": "",
            "length": 6,
            "suffix": None,
            "__provider": serialize_provider(SuffixProvider()),
        },
        "outputs": {
            "keeper": "",
            "length": 6,
            "suffix": "k3x9q2",
            "__provider": serialize_provider(SuffixProvider()),
        },
    }
    others = [
        {"urn": stack_urn, "custom": False, "type": "pulumi:pulumi:Stack"},
        {
            "urn": PY.rpartition("::")[0],
            "custom": True,
            "id": "8d1e",
            "type": "pulumi:providers:pulumi-python",
        },
        {
            "urn": LIBVIRT,
            "custom": True,
            "id": "5a7b",
            "type": "pulumi:providers:libvirt",
            "inputs": {"uri": OLD_URI},
        },
        suffix,
        {"urn": component, "custom": False, "type": "proxy-operator:index:Proxy", "parent": stack_urn},
    ]
    return {"manifest": {}, "resources": [*others, base, volume, disk, domain]}


def test_a_pulumi_libvirt_stack_moves_over_and_the_next_up_changes_nothing() -> None:
    declared = _declared()
    migrated = migrate(_pulumi_libvirt_state(declared))["resources"]
    by_urn = {r["urn"]: r for r in migrated}

    assert not [r for r in migrated if r["type"].startswith(("libvirt:", "pulumi:providers:libvirt"))]
    moved = [r for r in migrated if r["type"].startswith(f"{NEW}Libvirt")]
    assert sorted(r["type"].removeprefix(NEW) for r in moved) == sorted(PROVIDERS)
    for resource in moved:
        assert resource["provider"] == PY
        assert all(dep in by_urn for dep in resource.get("dependencies", [])), resource["dependencies"]
        wanted = declared[f"{resource['type']}::{resource['urn'].rpartition('::')[2]}"]
        diff = PROVIDERS[resource["type"].removeprefix(NEW)].diff(resource["id"], resource["outputs"], wanted)
        assert (diff.changes, diff.replaces) == (False, []), (resource["type"], diff.__dict__)
    domain = next(r for r in moved if r["type"].endswith("LibvirtDomain"))
    assert (domain["id"], domain["outputs"]["address"]) == (UUID, "192.168.122.50")
    disk = next(r for r in moved if r["type"].endswith("LibvirtCloudInitDisk"))
    assert domain["outputs"]["cidataPath"] == disk["outputs"]["path"] == disk["id"].split(";")[0]


def test_the_host_and_ssh_folder_come_back_from_the_old_provider_uri() -> None:
    assert host_of(OLD_URI) == ("qemu+ssh://virt@hv1.lan:2222/system", "/etc/proxy-operator/kvm")
    with_socket = OLD_URI.replace("/system?", "/system?socket=/run/libvirt/libvirt-sock&")
    assert host_of(with_socket)[0] == "qemu+ssh://virt@hv1.lan:2222/system?socket=/run/libvirt/libvirt-sock"


@pytest.mark.engine
def test_through_the_engine_export_migrate_import_then_preview_changes_nothing(
    pulumi_env: PulumiEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented path with the real CLI and a `file://` backend: the pulumi-libvirt state imported
    (no plugin is needed to hold it), exported, migrated, imported again, then `preview` of the program:
    every resource the same. preview contacts no host: the providers' diff decides."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    work = tmp_path / "work"
    work.mkdir()
    (work / "Pulumi.yaml").write_text(f"name: {PROJECT}\nruntime: python\nmain: {REPO / 'stacks'}\n")
    stack = auto.create_or_select_stack(stack_name=STACK, work_dir=str(work))
    item = {"namespace": "crawl", "name": "a", "labels": {}, "spec": SPEC}
    stack.set_config("proxy-operator:provider", auto.ConfigValue(ENTRY.model_dump_json(by_alias=True)))
    stack.set_config("proxy-operator:proxies", auto.ConfigValue(json.dumps([item])))
    stack.set_config("proxy-operator:kvmSshDir", auto.ConfigValue(SETTINGS.kvm_ssh_dir))
    empty = dict(stack.export_stack().deployment or {})
    old = _pulumi_libvirt_state(_declared())
    stack.import_stack(auto.Deployment(version=3, deployment={**empty, "resources": old["resources"]}))

    exported = dict(stack.export_stack().deployment or {})
    stack.import_stack(auto.Deployment(version=3, deployment=migrate(exported)))
    preview = stack.preview()
    assert set(preview.change_summary) == {"same"}, preview.change_summary
