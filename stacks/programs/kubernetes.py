"""The `kubernetes` provider type: one Deployment + Service per proxy, running 3proxy (HTTP or SOCKS5).

The container runs 3proxy directly on a configuration file mounted from the proxy's Secret (which also holds
the credentials), so the root filesystem stays read-only; the image's own templating entrypoint is bypassed.
Source ranges are enforced three times: 3proxy's ACL, a NetworkPolicy, and `loadBalancerSourceRanges`.
The egress policy twice: 3proxy's ACL (on the resolved address) and the NetworkPolicy's egress rules.
The Secret is replaced (new name) whenever its content changes, which rolls the Deployment.

Published address: the LoadBalancer ingress IP or hostname for `LoadBalancer` Services; otherwise the
cluster DNS name `<svc>.<ns>.svc.cluster.local`, reachable on the proxy port from inside the cluster.

Every object carries `pulumi.com/patchForce: "true"`: the service is the only owner of these objects, so a
field someone else changed (an edit with another field manager than kubectl's, which the provider takes over
by itself) is put back by the next `up` instead of failing the whole stack with a server-side apply conflict.

Test-only: with PROXY_OPERATOR_K8S_BARE_APISERVER=1 in the program's environment every object carries the
provider's `pulumi.com/skipAwait` and background `pulumi.com/deletionPropagationPolicy` annotations, for an
API server with no kubelet and no controller-manager (tests/kube): Pods never start there, so the provider's
await would wait for ever, and foreground deletion waits for a garbage collector that never runs. Off by
default; a real cluster needs neither.
"""

from __future__ import annotations

import os
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

from stacks.egress import METADATA_ADDRESSES, denied_ranges
from stacks.models import EgressSpec, KubernetesProvider
from stacks.programs.component import (
    ProxyEndpoint,
    kubernetes_labels,
    kubernetes_object_labels,
    physical_name,
)
from stacks.programs.context import ProgramSettings, ProxyContext, proxy_settings
from stacks.programs.kube_access import check_access
from stacks.programs.proxy_config import ProxySettings

CONFIG_DIR = "/etc/3proxy-operator"
CONFIG_KEY = "3proxy.cfg"
RUN_AS = 10001  # the image's unprivileged 3proxy user
UNPRIVILEGED_PORT = 3128  # containers run without NET_BIND_SERVICE: a port below 1024 maps to this one
BARE_APISERVER_ENV = "PROXY_OPERATOR_K8S_BARE_APISERVER"  # test-only, see the module docstring
PATCH_FORCE = "pulumi.com/patchForce"
SKIP_AWAIT = "pulumi.com/skipAwait"
DELETION_PROPAGATION = "pulumi.com/deletionPropagationPolicy"


def provider_annotations() -> dict[str, str]:
    """Annotations the Kubernetes provider reads on each object: a forced apply, and the test-only
    settings of an API server without kubelet or controller-manager (off unless the variable is "1")."""
    annotations = {PATCH_FORCE: "true"}
    if os.environ.get(BARE_APISERVER_ENV) == "1":
        annotations |= {SKIP_AWAIT: "true", DELETION_PROPAGATION: "background"}
    return annotations


class LoadBalancerPendingError(RuntimeError):
    """A LoadBalancer Service without an ingress address: nothing to publish yet."""


def container_port(port: int) -> int:
    return port if port >= 1024 else UNPRIVILEGED_PORT


def _acl_ports(ports: list[int]) -> str:
    return ",".join(str(port) for port in ports) or "*"


def egress_acl(who: str, sources: str, policy: EgressSpec) -> list[str]:
    """3proxy ACL lines for `spec.egress`, first match wins (3proxy matches IP targets on the resolved
    address): metadata refused, explicit allows, the denied ranges refused, public on allowPorts."""
    lines = [f"deny * * {','.join(METADATA_ADDRESSES)}"]
    lines += [f"allow {who} {sources} {rule.cidr} {_acl_ports(rule.ports)}" for rule in policy.allow]
    lines.append(f"deny * * {','.join(denied_ranges(4) + denied_ranges(6))}")
    if policy.allow_ports:
        lines.append(f"allow {who} {sources} * {_acl_ports(policy.allow_ports)}")
    return lines


def threeproxy_conf(settings: ProxySettings) -> str:
    creds, ranges = settings.credentials, ",".join(settings.allowed_source_ranges) or "*"
    lines = ["nscache 65536", "timeouts 1 5 30 60 180 1800 15 60", "log", "maxconn 200"]
    if creds:
        lines += [f"users {creds.username}:CL:{creds.password}", "auth strong"]
    else:
        lines += ["auth iponly"]
    lines += egress_acl(creds.username if creds else "*", ranges, settings.egress)
    service = "socks" if settings.protocol == "socks5" else "proxy -a"
    lines += ["deny *", f"{service} -n -p{container_port(settings.port)}"]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def provider(entry: KubernetesProvider, settings: ProgramSettings) -> k8s.Provider:
    """The entry's provider, once its user is known to hold the permissions the program needs.

    kubeconfigSecret set: the automation passes that kubeconfig as providerCredentials; else the ambient
    configuration ($KUBECONFIG, ~/.kube/config, or the in-cluster ServiceAccount)."""
    kubeconfig = settings.provider_credentials if entry.kubeconfig_secret else None

    def checked(value: str | None) -> str | None:
        check_access(kubeconfig=value, namespace=entry.namespace, provider=entry.name)
        return value

    if kubeconfig is None:
        checked(None)
        return k8s.Provider(f"k8s-{entry.name}", namespace=entry.namespace)
    return k8s.Provider(f"k8s-{entry.name}", kubeconfig=kubeconfig.apply(checked), namespace=entry.namespace)


def _secret(ctx: ProxyContext, *, meta: dict[str, Any], opts: pulumi.ResourceOptions) -> k8s.core.v1.Secret:
    def data(settings: ProxySettings) -> dict[str, str]:
        values = {CONFIG_KEY: threeproxy_conf(settings)}
        if settings.credentials:
            values |= {"username": settings.credentials.username, "password": settings.credentials.password}
        return values

    # Auto-named from the (DNS-safe) logical name, and replaced on any change: the new name rolls the pods.
    # The provider replaces a Secret on a data change by itself (unless its enableSecretMutable is set) and
    # reports the change under `data` (it folds stringData into data): both paths are named here.
    return k8s.core.v1.Secret(
        meta["name"],
        metadata={key: value for key, value in meta.items() if key != "name"},
        string_data=pulumi.Output.secret(cast(Any, proxy_settings(ctx).apply(data))),
        opts=pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(replace_on_changes=["stringData", "data"])
        ),
    )


def _container(ctx: ProxyContext, block: Any) -> dict[str, Any]:
    port = container_port(ctx.proxy.spec.port)
    probe = {"tcpSocket": {"port": port}, "periodSeconds": 10}
    return {
        "name": "proxy",
        "image": block.image,
        "command": ["/bin/3proxy", f"{CONFIG_DIR}/{CONFIG_KEY}"],
        "ports": [{"name": "proxy", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {**probe, "initialDelaySeconds": 2},
        "livenessProbe": {**probe, "initialDelaySeconds": 10},
        "resources": block.resources,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
    }


def _deployment(
    ctx: ProxyContext,
    *,
    meta: dict[str, Any],
    selector: dict[str, str],
    pod_labels: dict[str, str],
    secret: k8s.core.v1.Secret,
    block: Any,
    opts: pulumi.ResourceOptions,
) -> k8s.apps.v1.Deployment:
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "fsGroup": RUN_AS},
        "containers": [_container(ctx, block)],
        "volumes": [{"name": "config", "secret": {"secretName": secret.metadata.name, "defaultMode": 0o440}}],
    }
    spec: dict[str, Any] = {
        "replicas": 1,
        "selector": {"matchLabels": selector},
        "template": {"metadata": {"labels": {**pod_labels, **selector}}, "spec": pod_spec},
    }
    return k8s.apps.v1.Deployment(ctx.proxy.key, metadata=cast(Any, meta), spec=cast(Any, spec), opts=opts)


def _service(
    ctx: ProxyContext,
    *,
    meta: dict[str, Any],
    selector: dict[str, str],
    block: Any,
    opts: pulumi.ResourceOptions,
) -> k8s.core.v1.Service:
    spec = ctx.proxy.spec
    service_spec: dict[str, Any] = {
        "type": block.service_type,
        "selector": selector,
        "ports": [
            {"name": "proxy", "port": spec.port, "targetPort": container_port(spec.port), "protocol": "TCP"}
        ],
    }
    if block.service_type != "ClusterIP":
        service_spec["externalTrafficPolicy"] = "Local"  # keep client addresses for the NetworkPolicy and ACL
    if block.service_type == "LoadBalancer" and spec.allowed_source_ranges:
        service_spec["loadBalancerSourceRanges"] = list(spec.allowed_source_ranges)
    return k8s.core.v1.Service(
        ctx.proxy.key, metadata=cast(Any, meta), spec=cast(Any, service_spec), opts=opts
    )


def _egress_rules(policy: EgressSpec) -> list[dict[str, Any]]:
    """Public destinations on allowPorts, DNS, and the explicit allows: pod traffic leaves after NAT, so
    the private, CGNAT, unique-local and link-local ranges are refused here as well as in 3proxy."""

    def ports(numbers: list[int]) -> list[dict[str, Any]]:
        return [{"port": port, "protocol": "TCP"} for port in numbers]

    public = [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": denied_ranges(4)}},
        {"ipBlock": {"cidr": "::/0", "except": [r for r in denied_ranges(6) if r != "::/0"]}},
    ]
    rules: list[dict[str, Any]] = []
    if policy.allow_ports:
        rules.append({"to": public, "ports": ports(policy.allow_ports)})
    rules.append({"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]})
    for rule in policy.allow:
        allowed: dict[str, Any] = {"to": [{"ipBlock": {"cidr": rule.cidr}}]}
        rules.append(allowed | ({"ports": ports(rule.ports)} if rule.ports else {}))
    return rules


def _network_policy(
    ctx: ProxyContext, *, meta: dict[str, Any], selector: dict[str, str], opts: pulumi.ResourceOptions
) -> None:
    ranges = ctx.proxy.spec.allowed_source_ranges
    spec: dict[str, Any] = {
        "podSelector": {"matchLabels": selector},
        "policyTypes": ["Egress"],
        "egress": _egress_rules(ctx.egress),
    }
    if ranges:  # without ranges the proxy port stays open to all (credentials are then required)
        spec["policyTypes"] = ["Ingress", "Egress"]
        spec["ingress"] = [
            {
                "from": [{"ipBlock": {"cidr": cidr}} for cidr in ranges],
                "ports": [{"port": container_port(ctx.proxy.spec.port), "protocol": "TCP"}],
            }
        ]
    k8s.networking.v1.NetworkPolicy(ctx.proxy.key, metadata=cast(Any, meta), spec=cast(Any, spec), opts=opts)


def _published_host(
    service: k8s.core.v1.Service, *, name: str, namespace: str, service_type: str
) -> pulumi.Input[str]:
    if service_type != "LoadBalancer":
        return f"{name}.{namespace}.svc.cluster.local"

    def ingress_address(status: Any) -> str:
        # The provider waits for an address before it reports the Service ready; with skipAwait (tests) or
        # a load balancer that answers without one there is none: say so (the stack retries) rather than
        # fail on an empty list.
        ingress = status.load_balancer.ingress if status and status.load_balancer else None
        address = (ingress[0].ip or ingress[0].hostname) if ingress else None
        if not address:
            raise LoadBalancerPendingError(
                f"Service {namespace}/{name} has no load-balancer address yet: a LoadBalancer Service needs "
                "a load-balancer controller in the cluster (a cloud's, or MetalLB); use ClusterIP or "
                "NodePort without one"
            )
        return str(address)

    return service.status.apply(ingress_address)


def _proxy(
    entry: KubernetesProvider, ctx: ProxyContext, settings: ProgramSettings, k8s_provider: k8s.Provider
) -> ProxyEndpoint:
    spec, block = ctx.proxy.spec, ctx.proxy.spec.block_for("kubernetes")
    name = physical_name("px", ctx.proxy)
    selector = {"app.kubernetes.io/instance": name}
    # The installation label is on the objects only: on the pod template it would roll every pod once.
    labels = {**kubernetes_object_labels(ctx.proxy, settings.stack, settings.installation), **selector}
    pod_labels = kubernetes_labels(ctx.proxy, settings.stack)
    meta = {
        "name": name,
        "namespace": entry.namespace,
        "labels": labels,
        "annotations": provider_annotations(),
    }
    opts = pulumi.ResourceOptions(parent=ctx.component, provider=k8s_provider)
    secret = _secret(ctx, meta=meta, opts=opts)
    deployment = _deployment(
        ctx, meta=meta, selector=selector, pod_labels=pod_labels, secret=secret, block=block, opts=opts
    )
    service = _service(ctx, meta=meta, selector=selector, block=block, opts=opts)
    _network_policy(ctx, meta=meta, selector=selector, opts=opts)
    host = _published_host(service, name=name, namespace=entry.namespace, service_type=block.service_type)
    return ProxyEndpoint(host=host, port=spec.port, protocol=spec.protocol.value, instance_id=deployment.id)


def build(
    entry: KubernetesProvider, contexts: list[ProxyContext], settings: ProgramSettings
) -> dict[str, ProxyEndpoint]:
    k8s_provider = provider(entry, settings)
    return {ctx.proxy.key: _proxy(entry, ctx, settings, k8s_provider) for ctx in contexts}
