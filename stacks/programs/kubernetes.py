"""The `kubernetes` provider type: one Deployment + Service + NetworkPolicy per proxy (HTTP or SOCKS5).

The container runs the project's own forward proxy (`stacks.forward_proxy`, the `local` provider's daemon)
from the service's own image (`proxy-operator-forward-proxy`, docs/decisions.md "The proxy in pods and
VMs"), on a JSON configuration mounted from the proxy's Secret (which also holds the credentials), so the
root filesystem stays read-only. A Proxy that names a 3proxy image keeps 3proxy (`threeproxy.py`). With the
service in the cluster and credentials, the forward proxy also takes lease users on a control port behind a
headless Service (`kube_control.py`).
Source ranges are enforced three times: the proxy's own check, a NetworkPolicy, and
`loadBalancerSourceRanges`. The egress policy twice: the proxy (on the resolved address, with the same
policy code as `local`) and the NetworkPolicy's egress rules. The Secret is replaced (new name) whenever its
content changes, which rolls the Deployment.

Published address: the LoadBalancer ingress IP or hostname for `LoadBalancer` Services; otherwise the
cluster DNS name `<svc>.<ns>.svc.cluster.local`, reachable on the proxy port from inside the cluster.

Every object carries `pulumi.com/patchForce: "true"`: the service is the only owner of these objects, so a
field someone else changed (an edit with another field manager than kubectl's, which the provider takes over
by itself) is put back by the next `up` instead of failing the whole stack with a server-side apply conflict.

The provider's defaults hold: an `up` waits until the Deployment's new pods are ready and the Service has
endpoints (so the published address answers), and a deletion is in the foreground (the pods are gone before
the Deployment is). tests/kube runs the program against a node with a kubelet (tests/kube/node.py).
"""

from __future__ import annotations

import json
import math
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

from stacks.egress import denied_ranges
from stacks.forward_proxy.config import ProxyConfig
from stacks.forward_proxy.control import FOLLOW_SECONDS
from stacks.models import EgressSpec, KubernetesProvider
from stacks.programs import kube_control, threeproxy
from stacks.programs.component import (
    ProxyEndpoint,
    kubernetes_labels,
    kubernetes_object_labels,
    physical_name,
)
from stacks.programs.context import ProgramSettings, ProxyContext, proxy_settings
from stacks.programs.kube_access import check_access
from stacks.programs.probe_allow import ProbePods
from stacks.programs.proxy_config import ProxySettings

CONFIG_DIR = "/etc/proxy-operator"
CONFIG_KEY = "proxy.json"
DAEMON = "proxy-operator-forward-proxy"  # the image's console script: `python -m stacks.forward_proxy`
RUN_AS = 10001  # the image's unprivileged user (the service's, and 3proxy's in its image)
UNPRIVILEGED_PORT = 3128  # containers run without NET_BIND_SERVICE: a port below 1024 maps to this one
PATCH_FORCE = "pulumi.com/patchForce"
PRE_STOP_SECONDS = 5  # well inside the pod's default 30 s grace
# The kubelet's first readiness probe comes one period after the container starts (its first try finds no
# running container yet): with 10 s a new pod, and so every rollout step and every `up`, waited 10 s for a
# proxy that listens within a second. A TCP connect every 2 s costs the pod nothing; liveness keeps 10 s.
READINESS_PERIOD_SECONDS = 2
# A new pod takes traffic only once each service replica could give it the live lease users (the control
# channel's FOLLOW_SECONDS): before, a rollout answered 407 to live leases for a moment (seen on the node).
# A round later than that (a loaded node) is covered by the proxy's hold (stacks/forward_proxy/users.py).
READINESS_DELAY_SECONDS = math.ceil(FOLLOW_SECONDS) + 1


def provider_annotations() -> dict[str, str]:
    """Annotations the Kubernetes provider reads on each object: a forced apply."""
    return {PATCH_FORCE: "true"}


class LoadBalancerPendingError(RuntimeError):
    """A LoadBalancer Service without an ingress address: nothing to publish yet."""


def container_port(port: int) -> int:
    return port if port >= 1024 else UNPRIVILEGED_PORT


def forward_proxy_config(settings: ProxySettings, *, control: str | None = None) -> str:
    """The forward proxy's configuration file (stacks/forward_proxy/config.py) for a pod: every address
    of the pod on the container port; `control`: its lease users' channel (`kube_control.py`)."""
    creds = settings.credentials
    config = ProxyConfig(
        bind="0.0.0.0",
        port=container_port(settings.port),
        protocol=settings.protocol,
        egress=settings.egress,
        sources=settings.allowed_source_ranges,
        username=creds.username if creds else None,
        password=creds.password if creds else None,
        control=control,
    )
    return json.dumps(config.to_json(), sort_keys=True) + "\n"


def _daemon(image: str) -> tuple[list[str], str, str]:
    """The container's command, the folder its configuration is mounted in and the file's key."""
    if threeproxy.is_threeproxy(image):
        return threeproxy.command(), threeproxy.CONFIG_DIR, threeproxy.CONFIG_KEY
    return [DAEMON, f"{CONFIG_DIR}/{CONFIG_KEY}"], CONFIG_DIR, CONFIG_KEY


def daemon_config(image: str, settings: ProxySettings, *, control: str | None = None) -> dict[str, str]:
    """The Secret's entry holding the daemon's configuration, for the daemon `image` runs (3proxy: never a
    control channel)."""
    if threeproxy.is_threeproxy(image):
        return {threeproxy.CONFIG_KEY: threeproxy.config(settings, listen_port=container_port(settings.port))}
    return {CONFIG_KEY: forward_proxy_config(settings, control=control)}


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


def _secret(
    ctx: ProxyContext, *, meta: dict[str, Any], image: str, control: str | None, opts: pulumi.ResourceOptions
) -> k8s.core.v1.Secret:
    def data(settings: ProxySettings) -> dict[str, str]:
        values = daemon_config(image, settings, control=control)
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


def _container(ctx: ProxyContext, block: Any, *, control: bool) -> dict[str, Any]:
    port = container_port(ctx.proxy.spec.port)
    probe = {"tcpSocket": {"port": port}}
    command, config_dir, _ = _daemon(block.image)
    ports = [{"name": "proxy", "containerPort": port, "protocol": "TCP"}]
    return {
        "name": "proxy",
        "image": block.image,
        "command": command,
        "ports": ports + ([kube_control.container_port(port)] if control else []),
        "readinessProbe": {
            **probe,
            "initialDelaySeconds": READINESS_DELAY_SECONDS,
            "periodSeconds": READINESS_PERIOD_SECONDS,
        },
        "livenessProbe": {**probe, "initialDelaySeconds": 10, "periodSeconds": 10},
        # A pod being replaced keeps serving while kube-proxy takes it out of the Service (seen on the test
        # node: without it a client got one refused connection per rollout). The kubelet's sleep action
        # needs no binary in the image.
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SECONDS}}},
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
        "volumeMounts": [{"name": "config", "mountPath": config_dir, "readOnly": True}],
    }


def _deployment(
    ctx: ProxyContext,
    *,
    meta: dict[str, Any],
    selector: dict[str, str],
    pod_labels: dict[str, str],
    secret: k8s.core.v1.Secret,
    block: Any,
    control: bool,
    opts: pulumi.ResourceOptions,
) -> k8s.apps.v1.Deployment:
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "fsGroup": RUN_AS},
        "containers": [_container(ctx, block, control=control)],
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
            # By name: during a rollout that changes the port, each endpoint is its own pod's port.
            {"name": "proxy", "port": spec.port, "targetPort": "proxy", "protocol": "TCP"}
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


def _probe_rule(pods: ProbePods) -> dict[str, Any]:
    """The health probe's way to the service's own pods (the probe URL's ClusterIP is DNATed to them
    before the policy judges the packet, so its ipBlock allow never matches there)."""
    return {"to": [kube_control.service_pods(pods)], "ports": [{"port": pods.port, "protocol": "TCP"}]}


def _ingress_rules(ctx: ProxyContext, *, probe_pods: ProbePods | None, control: bool) -> list[dict[str, Any]]:
    """The proxy port from the source ranges (from anyone without ranges: credentials are then required),
    and the control port from the service's pods only. Empty: no Ingress policy (the proxy port is open)."""
    ranges, port = ctx.proxy.spec.allowed_source_ranges, container_port(ctx.proxy.spec.port)
    # By name, as the Service targets it: during a rollout that changes the port the old pod's and the new
    # pod's ports are both admitted (a number would cut the old pod off as soon as the policy changes).
    proxy_rule: dict[str, Any] = {"ports": [{"port": "proxy", "protocol": "TCP"}]}
    if ranges:
        proxy_rule = {"from": [{"ipBlock": {"cidr": cidr}} for cidr in ranges], **proxy_rule}
    if control and probe_pods is not None:
        return [proxy_rule, kube_control.ingress_rule(probe_pods, proxy_port=port)]
    return [proxy_rule] if ranges else []


def _network_policy(
    ctx: ProxyContext,
    *,
    meta: dict[str, Any],
    selector: dict[str, str],
    probe_pods: ProbePods | None,
    control: bool,
    opts: pulumi.ResourceOptions,
) -> None:
    egress = _egress_rules(ctx.egress) + ([_probe_rule(probe_pods)] if probe_pods else [])
    spec: dict[str, Any] = {
        "podSelector": {"matchLabels": selector},
        "policyTypes": ["Egress"],
        "egress": egress,
    }
    if ingress := _ingress_rules(ctx, probe_pods=probe_pods, control=control):
        spec["policyTypes"] = ["Ingress", "Egress"]
        spec["ingress"] = ingress
    k8s.networking.v1.NetworkPolicy(ctx.proxy.key, metadata=cast(Any, meta), spec=cast(Any, spec), opts=opts)


def _published_host(
    service: k8s.core.v1.Service, *, name: str, namespace: str, service_type: str
) -> pulumi.Input[str]:
    if service_type != "LoadBalancer":
        return f"{name}.{namespace}.svc.cluster.local"

    def ingress_address(status: Any) -> str:
        # The provider waits for an address before it reports the Service ready; a load balancer that
        # answers without one leaves none: say so (the stack retries) rather than fail on an empty list.
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
    control, port = kube_control.enabled(ctx, settings, image=block.image), container_port(spec.port)
    listen = kube_control.listen(port) if control else None
    secret = _secret(ctx, meta=meta, image=block.image, control=listen, opts=opts)
    deployment = _deployment(
        ctx,
        meta=meta,
        selector=selector,
        pod_labels=pod_labels,
        secret=secret,
        block=block,
        control=control,
        opts=opts,
    )
    # After the rollout: the new pods serve the new port before the Service publishes it (a port change
    # then costs a client only the switch to the new port, never a refused connection on the old one).
    service = _service(
        ctx,
        meta=meta,
        selector=selector,
        block=block,
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[deployment])),
    )
    _network_policy(
        ctx, meta=meta, selector=selector, probe_pods=settings.probe_pods, control=control, opts=opts
    )
    host = _published_host(service, name=name, namespace=entry.namespace, service_type=block.service_type)
    endpoint = ProxyEndpoint(
        host=host, port=spec.port, protocol=spec.protocol.value, instance_id=deployment.id
    )
    if not control:
        return endpoint  # no `control` key: leases share the proxy's credentials
    kube_control.headless_service(ctx.proxy, meta=meta, selector=selector, proxy_port=port, opts=opts)
    return kube_control.with_control(endpoint, ctx.proxy, namespace=entry.namespace, proxy_port=port)


def build(
    entry: KubernetesProvider, contexts: list[ProxyContext], settings: ProgramSettings
) -> dict[str, ProxyEndpoint]:
    k8s_provider = provider(entry, settings)
    return {ctx.proxy.key: _proxy(entry, ctx, settings, k8s_provider) for ctx in contexts}
