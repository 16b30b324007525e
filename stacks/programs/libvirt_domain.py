"""The proxy's VM on libvirt-python: define, autostart, start, wait for its address (`libvirt_guest`), and
destroy + undefine on delete (its volumes are resources of their own, deleted after it).

The domain is of the catalogue's `domainType` (`kvm`, or `qemu` where the host has no usable hardware
virtualisation), boots the proxy's copy-on-write disk, reads the cidata ISO from an IDE cd-rom, sits on the
host's libvirt network, and has a serial console (`virsh console`, also logged by virtlogd), the guest
agent's channel (the credentials and an address take it) and a virtio RNG. Its id is its UUID, which the
orphan finder matches; its description carries our marks (`stacks/marks.py`).

A new domain starts from a fresh disk: its copy-on-write volume is made empty again first (`fresh_disk`), so
a VM made again after drift or replaced by a spec change never boots what a lost VM half-wrote. A create
that fails (paused, stopped, no address in time) removes the domain again: the engine records
nothing, so nothing else would. `read` finds a domain removed by hand gone (refresh drops it, the next `up`
makes it again), a stopped one `running: false`, which the next `up` starts again (an update), and a
running one at its current address. Any change
of what the VM is made of replaces it; a new description is set in place.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from xml.etree import ElementTree
from xml.sax.saxutils import escape, quoteattr

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider, UpdateResult

from stacks.programs import dynamic_pickling
from stacks.programs.libvirt_conn import connected, is_missing, libvirt_module
from stacks.programs.libvirt_guest import GuestStartError, current_address, wait_for_address
from stacks.programs.libvirt_resource import compare, gone
from stacks.programs.libvirt_upload import volume_xml

LEASE_TIMEOUT_SECONDS = 300
TB_CACHE_MIB = 128
REPLACE_ON = ("name", "domainType", "vcpus", "memoryMib", "diskPath", "diskSize", "cidataPath", "network")
OUTPUTS = ("address", "uuid")
MISSING = ("VIR_ERR_NO_DOMAIN",)


def domain_xml(props: dict[str, Any]) -> str:
    name = escape(props["name"])
    # Under TCG, QEMU's translation cache grows a guest's RSS past 800 MiB; 128 MiB halves it, same boot time.
    tcg = (
        f"<tcg><tb-cache unit='MiB'>{TB_CACHE_MIB}</tb-cache></tcg>" if props["domainType"] == "qemu" else ""
    )
    return f"""<domain type={quoteattr(props["domainType"])}>
  <name>{name}</name>
  <description>{escape(props["description"])}</description>
  <memory unit='MiB'>{int(props["memoryMib"])}</memory>
  <vcpu>{int(props["vcpus"])}</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
  <features><acpi/><apic/>{tcg}</features>
  <on_poweroff>destroy</on_poweroff>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/><source file={quoteattr(props["diskPath"])}/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/><source file={quoteattr(props["cidataPath"])}/>
      <target dev='hdc' bus='ide'/><readonly/>
    </disk>
    <interface type='network'>
      <source network={quoteattr(props["network"])}/><model type='virtio'/>
    </interface>
    <serial type='pty'><target port='0'/><log file='/var/log/libvirt/qemu/{name}-console.log'/></serial>
    <console type='pty'><target type='serial' port='0'/></console>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>
  </devices>
</domain>"""


def _lookup(conn: Any, uuid: str) -> Any | None:
    try:
        return conn.lookupByUUIDString(uuid)
    except Exception as exc:
        if is_missing(exc, *MISSING):
            return None
        raise


def remove(domain: Any) -> None:
    if domain.isActive():
        domain.destroy()
    domain.undefine()


def _start(domain: Any, props: dict[str, Any]) -> str:
    with _kvm_hint(props):
        domain.create()
    return wait_for_address(
        domain,
        domain_type=props["domainType"],
        timeout=float(props.get("leaseTimeout") or LEASE_TIMEOUT_SECONDS),
    )


@contextmanager
def _kvm_hint(props: dict[str, Any]) -> Iterator[None]:
    """A host without usable KVM refuses a `kvm` domain at define or start (no kvm capabilities, /dev/kvm
    missing): the error says what to change."""
    libvirt = libvirt_module()
    try:
        yield
    except libvirt.libvirtError as exc:
        if props["domainType"] != "kvm" or "kvm" not in str(exc).lower():
            raise
        raise GuestStartError(
            f"the domain {props['name']} cannot run with domain type kvm on {props['uri']} ({exc}): set "
            "domainType: qemu in the catalogue entry to run its guests in software (TCG, slower)"
        ) from exc


def _define(conn: Any, props: dict[str, Any]) -> Any:
    """A new domain on a fresh disk; never a redefinition (libvirt would take a same-named domain's UUID and
    rewrite it), and never a reset of the disk of a VM that still runs under the name."""
    try:
        taken = conn.lookupByName(props["name"])
    except Exception as exc:
        if not is_missing(exc, *MISSING):
            raise
        fresh_disk(conn, props["diskPath"])
        with _kvm_hint(props):
            return conn.defineXML(domain_xml(props))
    raise RuntimeError(
        f"a domain {props['name']} already exists on {props['uri']} (UUID {taken.UUIDString()}): a proxy "
        "forgotten with skip-cleanup keeps its VM; remove that VM (virsh destroy + undefine) or rename the "
        "Proxy"
    )


def fresh_disk(conn: Any, path: str) -> None:
    """Empty the proxy's copy-on-write disk again (the same volume: name, size, backing image) before a new
    domain boots it. A VM is stateless (cloud-init and the delivered credentials make it), and a disk a
    lost VM left may be half-written: a VM destroyed by hand (drift) left zero-length cloud-init caches and
    a truncated nftables.conf on the test KVM host, and the next boot came up with no network."""
    try:
        volume = conn.storageVolLookupByPath(path)
    except Exception as exc:
        if is_missing(exc, "VIR_ERR_NO_STORAGE_VOL"):
            return  # not a volume libvirt knows: the domain's start says what is wrong
        raise
    tree = ElementTree.fromstring(volume.XMLDesc(0))
    backing = tree.findtext("backingStore/path")
    if not backing:
        return  # not an overlay: nothing to reset from
    name = tree.findtext("name") or volume.name()
    capacity = int(tree.findtext("capacity") or 0)
    pool = volume.storagePoolLookupByVolume()
    volume.delete(0)
    pool.createXML(volume_xml(name=name, capacity=capacity, fmt="qcow2", backing=backing), 0)


class DomainProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        with connected(props["uri"], props["sshDir"]) as conn:
            domain = _define(conn, props)
            try:
                domain.setAutostart(1)
                address = _start(domain, props)
            except BaseException:
                remove(domain)
                raise
            uuid = domain.UUIDString()
            return CreateResult(id_=uuid, outs={**props, "address": address, "uuid": uuid, "running": True})

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        with connected(props["uri"], props["sshDir"]) as conn:
            domain = _lookup(conn, id_)
            if domain is None:
                return gone()
            running = bool(domain.isActive())
            # A lease that changed (the host or the guest restarted) moves the published address.
            address = (current_address(domain) if running else None) or props.get("address")
            return ReadResult(id_=id_, outs={**props, "running": running, "address": address})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return compare(olds, news, replace_on=REPLACE_ON, ignore=OUTPUTS)

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        outs = {**news, **{key: olds.get(key) for key in OUTPUTS}, "running": True}
        with connected(news["uri"], news["sshDir"]) as conn:
            domain = _lookup(conn, id_)
            if domain is None:
                raise RuntimeError(f"the domain {news['name']} ({id_}) is gone: run refresh, then up")
            if olds.get("description") != news.get("description"):
                libvirt = libvirt_module()
                flags = libvirt.VIR_DOMAIN_AFFECT_CONFIG
                flags |= libvirt.VIR_DOMAIN_AFFECT_LIVE if domain.isActive() else 0
                domain.setMetadata(
                    libvirt.VIR_DOMAIN_METADATA_DESCRIPTION, news["description"], None, None, flags
                )
            if not domain.isActive():
                outs["address"] = _start(domain, news)
        return UpdateResult(outs=outs)

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        with connected(props["uri"], props["sshDir"]) as conn:
            domain = _lookup(conn, id_)
            if domain is not None:
                remove(domain)


class LibvirtDomain(Resource, module="proxy-operator", name="LibvirtDomain"):
    """A proxy's VM; `address` is its IPv4 address once it booted, `uuid` its libvirt UUID (also the id)."""

    address: pulumi.Output[str]
    uuid: pulumi.Output[str]

    def __init__(self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        """`props`: uri, sshDir, name, description, domainType, vcpus, memoryMib, diskPath, diskSize,
        cidataPath, network, leaseTimeout."""
        outputs = {key: None for key in OUTPUTS}
        super().__init__(DomainProvider(), name, {**props, **outputs, "running": True}, opts)
        dynamic_pickling.unstack()
