"""The `gcp` provider type: one Compute Engine VM per proxy, running tinyproxy (HTTP) or dante (SOCKS5).

Per proxy: a firewall rule admitting exactly tcp:<port> from `allowedSourceRanges` to the VM's own network
tag (one rule per IP family: GCP refuses mixed families), an optional static external address, and the VM
whose startup script installs and configures the proxy. The startup script is `metadata_startup_script`, so
a change of port, credentials or ranges replaces the VM (a metadata edit alone would wait for a reboot).
Credentials never enter the metadata (readable by every project viewer): they live in a Secret Manager
secret per proxy, readable only by that proxy's own service account, which the VM runs as; the startup
script fetches them at boot (`boot_credentials`) and names the secret version, so a rotation still
replaces the VM.
The published address is the VM's external NAT IP, where the firewall admits the proxy port.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_gcp as gcp

from stacks.marks import description_words
from stacks.models import GcpProvider
from stacks.programs.boot_credentials import PLACEHOLDER, fetched_at_boot, gcp_secret_fetch
from stacks.programs.component import ProxyEndpoint, gcp_labels, physical_name
from stacks.programs.context import ProgramSettings, ProxyContext, proxy_settings
from stacks.programs.proxy_config import ProxySettings, setup_script

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"  # access is narrowed by IAM, not scopes


def provider(entry: GcpProvider, settings: ProgramSettings) -> gcp.Provider:
    # Without providerCredentials the provider uses ambient credentials (workload identity, ADC).
    return gcp.Provider(
        f"gcp-{entry.name}",
        project=entry.project,
        region=entry.region,
        zone=entry.zone,
        credentials=settings.provider_credentials,
        add_pulumi_attribution_label=False,
    )


def ranges_by_family(ranges: list[str]) -> dict[str, list[str]]:
    """{"v4": [...], "v6": [...]}; no ranges means no rule: the proxy port stays closed (validation refuses
    a gcp proxy without ranges; an empty list must never mean the internet)."""
    families: dict[str, list[str]] = {}
    for cidr in ranges:
        family = "v4" if ipaddress.ip_network(cidr).version == 4 else "v6"
        families.setdefault(family, []).append(cidr)
    return families


def firewall_description(ctx: ProxyContext, settings: ProgramSettings) -> str:
    """A firewall rule takes no labels: its description carries the same marks (`stacks/marks.py`)."""
    marks = description_words(installation=settings.installation, stack=settings.stack)
    return f"proxy-operator: proxy {ctx.proxy.key} port {ctx.proxy.spec.port}; {marks}"


def _firewalls(
    ctx: ProxyContext, *, entry: GcpProvider, tag: str, description: str, opts: pulumi.ResourceOptions
) -> None:
    spec = ctx.proxy.spec
    for family, ranges in ranges_by_family(spec.allowed_source_ranges).items():
        gcp.compute.Firewall(
            f"{ctx.proxy.key}-{family}",
            name=physical_name("px", ctx.proxy, max_length=60) + f"-{family}",
            network=entry.network,
            direction="INGRESS",
            allows=[{"protocol": "tcp", "ports": [str(spec.port)]}],
            source_ranges=ranges,
            target_tags=[tag],
            description=description,
            opts=opts,
        )


def _secret_credentials(
    ctx: ProxyContext, *, labels: dict[str, str], opts: pulumi.ResourceOptions
) -> tuple[pulumi.Output[str], gcp.compute.InstanceServiceAccountArgs, pulumi.Resource]:
    """The startup script that fetches the credentials, the VM's service account, and the grant."""
    assert ctx.credentials is not None
    key, spec = ctx.proxy.key, ctx.proxy.spec
    account = gcp.serviceaccount.Account(
        key,
        account_id=physical_name("px", ctx.proxy, max_length=30),
        display_name=f"proxy-operator proxy {key}",
        opts=opts,
    )
    secret = gcp.secretmanager.Secret(
        key,
        secret_id=physical_name("px", ctx.proxy),
        labels=labels,
        replication=gcp.secretmanager.SecretReplicationArgs(
            auto=gcp.secretmanager.SecretReplicationAutoArgs()
        ),
        opts=opts,
    )
    pair = pulumi.Output.all(ctx.credentials.username, ctx.credentials.password).apply(
        lambda c: f"{c[0]}:{c[1]}"
    )
    version = gcp.secretmanager.SecretVersion(key, secret=secret.id, secret_data=pair, opts=opts)
    grant = gcp.secretmanager.SecretIamMember(
        key,
        secret_id=secret.id,
        role="roles/secretmanager.secretAccessor",
        member=account.email.apply(lambda email: f"serviceAccount:{email}"),
        opts=opts,
    )
    placeholder = ProxySettings(
        port=spec.port,
        protocol=spec.protocol.value,
        allowed_source_ranges=tuple(spec.allowed_source_ranges),
        egress=ctx.egress,
        credentials=PLACEHOLDER,
    )
    script = pulumi.Output.from_input(version.name).apply(
        lambda name: fetched_at_boot(setup_script(placeholder), gcp_secret_fetch(name))
    )
    runs_as = gcp.compute.InstanceServiceAccountArgs(email=account.email, scopes=[CLOUD_PLATFORM])
    return script, runs_as, grant


def _proxy(
    entry: GcpProvider, ctx: ProxyContext, settings: ProgramSettings, gcp_provider: gcp.Provider
) -> ProxyEndpoint:
    spec, block = ctx.proxy.spec, ctx.proxy.spec.block_for("gcp")
    zone = block.zone or entry.zone
    name = physical_name("px", ctx.proxy)
    labels = gcp_labels(ctx.proxy, settings.stack, settings.installation)
    opts = pulumi.ResourceOptions(parent=ctx.component, provider=gcp_provider, delete_before_replace=True)
    description = firewall_description(ctx, settings)
    _firewalls(ctx, entry=entry, tag=name, description=description, opts=opts)
    nat_ip: pulumi.Input[str] | None = None  # None: an ephemeral external address
    if block.address_type == "static":
        region = zone.rsplit("-", 1)[0]
        nat_ip = gcp.compute.Address(
            ctx.proxy.key, name=name, region=region, labels=labels, opts=opts
        ).address
    access = gcp.compute.InstanceNetworkInterfaceAccessConfigArgs(nat_ip=nat_ip)
    script: pulumi.Input[str] = proxy_settings(ctx).apply(setup_script)  # no credentials: nothing secret
    runs_as, instance_opts = None, opts
    if ctx.credentials is not None:
        script, runs_as, grant = _secret_credentials(ctx, labels=labels, opts=opts)
        instance_opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[grant]))
    instance = gcp.compute.Instance(
        ctx.proxy.key,
        name=name,
        machine_type=block.machine_type,
        zone=zone,
        boot_disk=gcp.compute.InstanceBootDiskArgs(
            # Without the installation: a boot disk's labels are fixed at creation (a change replaces the VM).
            initialize_params=gcp.compute.InstanceBootDiskInitializeParamsArgs(
                image=block.image, labels=gcp_labels(ctx.proxy, settings.stack)
            )
        ),
        network_interfaces=[
            gcp.compute.InstanceNetworkInterfaceArgs(network=entry.network, access_configs=[access])
        ],
        metadata_startup_script=script,
        service_account=runs_as,
        tags=[name],
        labels=labels,
        scheduling=gcp.compute.InstanceSchedulingArgs(
            preemptible=block.preemptible,
            automatic_restart=not block.preemptible,
            on_host_maintenance="TERMINATE" if block.preemptible else "MIGRATE",
        ),
        opts=instance_opts,
    )
    host = instance.network_interfaces.apply(_nat_ip)
    return ProxyEndpoint(host=host, port=spec.port, protocol=spec.protocol.value, instance_id=instance.id)


def _nat_ip(nics: Sequence[Any]) -> str:
    access = nics[0].access_configs or []
    if not access or not access[0].nat_ip:
        raise RuntimeError("the instance has no external address: the proxy would be unreachable")
    return str(access[0].nat_ip)


def build(
    entry: GcpProvider, contexts: list[ProxyContext], settings: ProgramSettings
) -> dict[str, ProxyEndpoint]:
    gcp_provider = provider(entry, settings)
    return {ctx.proxy.key: _proxy(entry, ctx, settings, gcp_provider) for ctx in contexts}
