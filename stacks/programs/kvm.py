"""The `kvm` provider type: one libvirt VM per proxy on the catalogue's KVM hosts, reached over SSH.

Per host in use: a libvirt provider whose qemu+ssh URI names the mounted private key (`keyfile`) and
known_hosts (`knownhosts`: the parameter the bundled terraform-provider-libvirt reads), and one cached base
image volume per (host, pool). Per proxy: a copy-on-write volume backed by that image, a cloud-init disk that
installs and configures the proxy, and the domain; the published address is the domain's DHCP lease. A
proxy's credentials never enter the cloud-init disk: `kvm_credentials` writes them into the running guest
over SSH and the guest agent, and the setup reads them there.

The image cache rule: a base volume is never replaced or deleted while a proxy volume may back onto it.
`ignore_changes=["source"]` keeps a new upstream image from replacing it, and `retain_on_delete` leaves it on
the host when it leaves the stack (a forgotten proxy's disk may still use it). A retained volume keeps its
name on the host, so each base volume name carries a random suffix drawn when it enters the stack: a later
proxy on that host gets a fresh cache instead of colliding with the retained one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pulumi
import pulumi_libvirt as libvirt

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
from stacks.programs.proxy_config import (
    SETUP_PATH,
    ProxySettings,
    cloud_init_document,
    cloud_init_meta_data,
    cloud_init_user_data,
    setup_script,
)

KEY_FILE = "id_ed25519"
KNOWN_HOSTS_FILE = "known_hosts"
# Ours to set; any value the catalogue carries for these is replaced (no_verify is refused by the model).
SSH_PARAMETERS = ("keyfile", "knownhosts", "known_hosts", "known_hosts_verify", "no_verify")
GIB = 1024**3


def ssh_uri(host_uri: str, ssh_dir: str) -> str:
    """The catalogue URI plus the mounted key and known_hosts, with host key verification on."""
    parts = urlsplit(host_uri)
    query = [(key, value) for key, value in parse_qsl(parts.query) if key not in SSH_PARAMETERS]
    query += [
        ("keyfile", f"{ssh_dir.rstrip('/')}/{KEY_FILE}"),
        ("knownhosts", f"{ssh_dir.rstrip('/')}/{KNOWN_HOSTS_FILE}"),
        ("known_hosts_verify", "normal"),
    ]
    return urlunsplit(parts._replace(query=urlencode(query, safe="/")))


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
    """The libvirt provider and the cached base volume of each (host, pool) in use, made on first use."""

    def __init__(self, entry: KvmProvider, settings: ProgramSettings) -> None:
        self.entry = entry
        self.settings = settings
        self._providers: dict[str, libvirt.Provider] = {}
        self._bases: dict[tuple[str, str], libvirt.Volume] = {}

    def provider(self, host: KvmHost) -> libvirt.Provider:
        if host.name not in self._providers:
            uri = ssh_uri(host.uri, self.settings.kvm_ssh_dir)
            self._providers[host.name] = libvirt.Provider(f"kvm-{self.entry.name}-{host.name}", uri=uri)
        return self._providers[host.name]

    def base_volume(self, host: KvmHost) -> libvirt.Volume:
        pool = host.pool or self.entry.pool
        if (host.name, pool) not in self._bases:
            self._bases[(host.name, pool)] = self._new_base(host, pool)
        return self._bases[(host.name, pool)]

    def _new_base(self, host: KvmHost, pool: str) -> libvirt.Volume:
        image = image_file_name(self.entry.base_image)
        logical = f"base-{host.name}-{pool}-{image}"
        suffix = StableSuffix(logical)
        stem, dot, extension = image.rpartition(".")
        return libvirt.Volume(
            logical,
            name=suffix.suffix.apply(lambda s: f"{stem}-{s}{dot}{extension}"),
            pool=pool,
            source=self.entry.base_image,
            format="qcow2",
            opts=pulumi.ResourceOptions(
                provider=self.provider(host), retain_on_delete=True, ignore_changes=["source"]
            ),
        )


def _lease_address(nics: Sequence[Any] | None) -> str:
    addresses = (nics[0].addresses if nics else None) or []
    if not addresses:
        raise RuntimeError("the domain got no DHCP lease: check the libvirt network's DHCP range")
    return str(addresses[0])


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


def _proxy(entry: KvmProvider, ctx: ProxyContext, hosts: HostResources) -> ProxyEndpoint:
    spec, block = ctx.proxy.spec, ctx.proxy.spec.block_for("kvm")
    host = host_for(entry, ctx.proxy)
    pool, network = host.pool or entry.pool, host.network or entry.network
    name = physical_name("px", ctx.proxy)
    opts = pulumi.ResourceOptions(parent=ctx.component, provider=hosts.provider(host))
    volume = libvirt.Volume(
        ctx.proxy.key,
        name=f"{name}.qcow2",
        pool=pool,
        base_volume_id=hosts.base_volume(host).id,
        size=block.disk_gib * GIB,
        format="qcow2",
        opts=opts,
    )
    user_data = _user_data(ctx, hostname=name)
    # A new configuration is a new cloud-init instance (so cloud-init runs the setup again on the same
    # disk) and a new ISO name (so the replacement ISO never collides with the one in use).
    config_id = user_data.apply(lambda text: f"{name}-{short_hash(text)}")
    cloud_init = libvirt.CloudInitDisk(
        ctx.proxy.key,
        name=config_id.apply(lambda cid: f"{cid}-cloudinit.iso"),
        pool=pool,
        user_data=user_data,
        meta_data=config_id.apply(lambda cid: cloud_init_meta_data(instance_id=cid, hostname=name)),
        opts=opts,
    )
    domain = libvirt.Domain(
        ctx.proxy.key,
        name=name,
        description=domain_description(ctx, hosts.settings),
        vcpu=block.vcpus,
        memory=block.memory_mib,
        autostart=True,
        cloudinit=cloud_init.id,
        disks=[{"volume_id": volume.id}],
        network_interfaces=[{"network_name": network, "hostname": name, "wait_for_lease": True}],
        consoles=[{"type": "pty", "target_port": "0", "target_type": "serial"}],
        # libvirt would swap the ISO in place and the running VM would never read it: replace the domain.
        # The libvirt provider replaces a domain whose description changes: a domain keeps the description
        # it was made with (one made before the installation mark keeps none; docs/operations.md).
        opts=pulumi.ResourceOptions.merge(
            opts,
            pulumi.ResourceOptions(
                replace_on_changes=["cloudinit"], delete_before_replace=True, ignore_changes=["description"]
            ),
        ),
    )
    address = domain.network_interfaces.apply(_lease_address)
    instance_id: pulumi.Output[str] = domain.id
    if ctx.credentials is not None:
        delivered = GuestCredentials(
            ctx.proxy.key,
            host_uri=host.uri,
            ssh_dir=hosts.settings.kvm_ssh_dir,
            domain=domain.name,
            domain_id=domain.id,
            username=ctx.credentials.username,
            password=ctx.credentials.password,
            opts=pulumi.ResourceOptions(parent=ctx.component, depends_on=[domain]),
        )
        # Published once the guest holds its credentials.
        instance_id = pulumi.Output.all(domain.id, delivered.id).apply(lambda ids: str(ids[0]))
    return ProxyEndpoint(host=address, port=spec.port, protocol=spec.protocol.value, instance_id=instance_id)


def build(
    entry: KvmProvider, contexts: list[ProxyContext], settings: ProgramSettings
) -> dict[str, ProxyEndpoint]:
    hosts = HostResources(entry, settings)
    return {ctx.proxy.key: _proxy(entry, ctx, hosts) for ctx in contexts}
