"""The `kvm` provider type: one libvirt VM per proxy on the catalogue's KVM hosts, reached over SSH.

The resources are Pulumi dynamic providers on libvirt-python (`libvirt_volumes`, `libvirt_cidata`,
`libvirt_domain`; decision in docs/decisions.md): each call connects to the host's catalogue URI over
libvirt's ssh transport, OpenSSH with the mounted key and known_hosts, host keys verified (`libvirt_conn`).
Per host and pool in use: one cached base image volume. Per proxy: a copy-on-write volume backed by that
image, a cloud-init disk that configures the proxy, and the domain (of the entry's `domainType`); the
published address is the domain's DHCP lease (or its guest agent's address). A proxy's credentials never enter
the cloud-init disk: `kvm_credentials` writes them into the running guest over SSH and the guest agent, and
the setup reads them there.

The image cache rule: a base volume is never replaced or deleted while a proxy volume may back onto it. Its
provider ignores a change of `source` and never deletes (`libvirt_volumes`); the program also sets
`ignore_changes=["source"]` and `retain_on_delete`, so the engine leaves it on the host when it leaves the
stack (a forgotten proxy's disk may still use it). A retained volume keeps its name on the host, so each base
volume name carries a random suffix drawn when it enters the stack: a later proxy on that host gets a fresh
cache instead of colliding with the retained one.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from urllib.parse import urlsplit

import pulumi

from stacks.marks import description_words
from stacks.models import KvmHost, KvmProvider
from stacks.programs.boot_credentials import PLACEHOLDER, fetched_at_boot, file_fetch
from stacks.programs.component import (
    InvalidInputError,
    ProgramProxy,
    ProxyEndpoint,
    physical_name,
    short_hash,
)
from stacks.programs.context import ProgramSettings, ProxyContext, proxy_settings
from stacks.programs.credentials import StableSuffix
from stacks.programs.kvm_credentials import (
    CREDENTIALS_PATH,
    RECEIVER_PATH,
    GuestCredentials,
    receiver_script,
)
from stacks.programs.libvirt_cidata import LibvirtCloudInitDisk
from stacks.programs.libvirt_domain import LEASE_TIMEOUT_SECONDS, LibvirtDomain
from stacks.programs.libvirt_volumes import LibvirtBaseVolume, LibvirtVolume
from stacks.programs.proxy_config import (
    SETUP_PATH,
    ProxySettings,
    cloud_init_document,
    cloud_init_meta_data,
    cloud_init_user_data,
    setup_script,
)

GIB = 1024**3


def host_for(entry: KvmProvider, proxy: ProgramProxy) -> KvmHost:
    wanted = proxy.spec.block_for("kvm").host
    host = entry.host(wanted)
    if host is None:
        known = ", ".join(h.name for h in entry.hosts)
        raise InvalidInputError(
            f"{proxy.key}: spec.kvm.host '{wanted}' is not a host of provider '{entry.name}' "
            f"(it has: {known}); add the host to that catalogue entry or pick one of its hosts"
        )
    return host


def image_file_name(base_image: str) -> str:
    name = PurePosixPath(urlsplit(base_image).path).name or "base-image.qcow2"
    return name if name.endswith((".qcow2", ".img")) else f"{name}.qcow2"


class HostResources:
    """The cached base volume of each (host, pool) in use, made on first use."""

    def __init__(self, entry: KvmProvider, settings: ProgramSettings) -> None:
        self.entry = entry
        self.settings = settings
        self._bases: dict[tuple[str, str], LibvirtBaseVolume] = {}

    def base_volume(self, host: KvmHost) -> LibvirtBaseVolume:
        pool = host.pool or self.entry.pool
        if (host.name, pool) not in self._bases:
            self._bases[(host.name, pool)] = self._new_base(host, pool)
        return self._bases[(host.name, pool)]

    def _new_base(self, host: KvmHost, pool: str) -> LibvirtBaseVolume:
        image = image_file_name(self.entry.base_image)
        logical = f"base-{host.name}-{pool}-{image}"
        suffix = StableSuffix(logical)
        stem, dot, extension = image.rpartition(".")
        return LibvirtBaseVolume(
            logical,
            uri=host.uri,
            ssh_dir=self.settings.kvm_ssh_dir,
            pool=pool,
            volume_name=suffix.suffix.apply(lambda s: f"{stem}-{s}{dot}{extension}"),
            source=self.entry.base_image,
            opts=pulumi.ResourceOptions(retain_on_delete=True, ignore_changes=["source"]),
        )


def domain_description(ctx: ProxyContext, settings: ProgramSettings) -> str:
    """The domain's marks (`stacks/marks.py`): a domain takes no labels, its description carries them."""
    return description_words(proxy=ctx.proxy.key, stack=settings.stack, installation=settings.installation)


def _user_data(ctx: ProxyContext, *, hostname: str) -> pulumi.Output[str]:
    """Without credentials, the setup as is; with them, the setup with placeholders reading the file that
    `GuestCredentials` delivers, the receiver it runs, and the guest agent that runs it."""
    if ctx.credentials is None:
        return proxy_settings(ctx).apply(lambda s: cloud_init_user_data(s, hostname=hostname))
    spec = ctx.proxy.spec
    placeholder = ProxySettings(
        port=spec.port,
        protocol=spec.protocol.value,
        allowed_source_ranges=tuple(spec.allowed_source_ranges),
        egress=ctx.egress,
        credentials=PLACEHOLDER,
    )
    files = {
        SETUP_PATH: fetched_at_boot(setup_script(placeholder), file_fetch(CREDENTIALS_PATH)),
        RECEIVER_PATH: receiver_script(SETUP_PATH),
    }
    document = cloud_init_document(
        hostname=hostname,
        files=files,
        packages=("qemu-guest-agent",),
        runcmd=[["systemctl", "start", "qemu-guest-agent"]],
    )
    return pulumi.Output.from_input(document)


def _volume(ctx: ProxyContext, *, host: KvmHost, hosts: HostResources, name: str) -> LibvirtVolume:
    return LibvirtVolume(
        ctx.proxy.key,
        uri=host.uri,
        ssh_dir=hosts.settings.kvm_ssh_dir,
        pool=host.pool or hosts.entry.pool,
        volume_name=f"{name}.qcow2",
        base_path=hosts.base_volume(host).path,
        size_bytes=ctx.proxy.spec.block_for("kvm").disk_gib * GIB,
        opts=pulumi.ResourceOptions(parent=ctx.component),
    )


def _cloud_init(ctx: ProxyContext, *, host: KvmHost, hosts: HostResources, name: str) -> LibvirtCloudInitDisk:
    user_data = _user_data(ctx, hostname=name)
    # A new configuration is a new cloud-init instance (so cloud-init runs the setup again on the same
    # disk) and a new ISO name (so the replacement ISO never collides with the one in use).
    config_id = user_data.apply(lambda text: f"{name}-{short_hash(text)}")
    return LibvirtCloudInitDisk(
        ctx.proxy.key,
        uri=host.uri,
        ssh_dir=hosts.settings.kvm_ssh_dir,
        pool=host.pool or hosts.entry.pool,
        volume_name=config_id.apply(lambda cid: f"{cid}-cloudinit.iso"),
        user_data=user_data,
        meta_data=config_id.apply(lambda cid: cloud_init_meta_data(instance_id=cid, hostname=name)),
        opts=pulumi.ResourceOptions(parent=ctx.component),
    )


def _domain(ctx: ProxyContext, *, host: KvmHost, hosts: HostResources, name: str) -> LibvirtDomain:
    block = ctx.proxy.spec.block_for("kvm")
    volume = _volume(ctx, host=host, hosts=hosts, name=name)
    cloud_init = _cloud_init(ctx, host=host, hosts=hosts, name=name)
    props = {
        "uri": host.uri,
        "sshDir": hosts.settings.kvm_ssh_dir,
        "name": name,
        "description": domain_description(ctx, hosts.settings),
        "domainType": hosts.entry.domain_type,
        "vcpus": block.vcpus,
        "memoryMib": block.memory_mib,
        "diskPath": volume.path,
        "diskSize": block.disk_gib * GIB,
        "cidataPath": cloud_init.path,
        "network": host.network or hosts.entry.network,
        "leaseTimeout": LEASE_TIMEOUT_SECONDS,
    }
    return LibvirtDomain(ctx.proxy.key, props, pulumi.ResourceOptions(parent=ctx.component))


def _proxy(entry: KvmProvider, ctx: ProxyContext, hosts: HostResources) -> ProxyEndpoint:
    host = host_for(entry, ctx.proxy)
    name = physical_name("px", ctx.proxy)
    domain = _domain(ctx, host=host, hosts=hosts, name=name)
    instance_id: pulumi.Output[str] = domain.id
    if ctx.credentials is not None:
        delivered = GuestCredentials(
            ctx.proxy.key,
            host_uri=host.uri,
            ssh_dir=hosts.settings.kvm_ssh_dir,
            domain=name,
            domain_id=domain.id,
            username=ctx.credentials.username,
            password=ctx.credentials.password,
            opts=pulumi.ResourceOptions(parent=ctx.component, depends_on=[domain]),
        )
        # Published once the guest holds its credentials.
        instance_id = pulumi.Output.all(domain.id, delivered.id).apply(lambda ids: str(ids[0]))
    spec = ctx.proxy.spec
    return ProxyEndpoint(
        host=domain.address, port=spec.port, protocol=spec.protocol.value, instance_id=instance_id
    )


def build(
    entry: KvmProvider, contexts: list[ProxyContext], settings: ProgramSettings
) -> dict[str, ProxyEndpoint]:
    hosts = HostResources(entry, settings)
    return {ctx.proxy.key: _proxy(entry, ctx, hosts) for ctx in contexts}
