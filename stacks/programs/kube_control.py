"""Lease users on proxy pods: the pods' control port, the headless Service that names every pod behind it,
and the NetworkPolicy rule that admits only the service's own pods to it (docs/security.md).

Only where the service runs in the cluster (`settings.probe_pods`: from outside it cannot reach pods), the
proxy authenticates (nothing to scope otherwise) and the image runs the project's forward proxy (3proxy has
no control channel). Then the forward proxy also listens on CONTROL_PORT (`tcp://0.0.0.0:PORT`, every
request carrying the token of the proxy's password: `stacks/forward_proxy/channel.py`), and the endpoint
exports `control = tcp://<name>-control.<ns>.svc.cluster.local:PORT`. That Service is headless and
publishes pods that are not ready yet: its name resolves to every pod of the proxy, during a rollout the old
and the new ones, and the service pushes each lease user to each of them.
"""

from __future__ import annotations

from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

from stacks.programs import threeproxy
from stacks.programs.component import ControlledEndpoint, ProgramProxy, ProxyEndpoint, physical_name
from stacks.programs.context import ProgramSettings, ProxyContext
from stacks.programs.probe_allow import ProbePods

CONTROL_PORT = 9178  # unprivileged: the containers run without NET_BIND_SERVICE
OTHER_CONTROL_PORT = 9179  # when the proxy itself listens on CONTROL_PORT
SUFFIX = "-control"


def enabled(ctx: ProxyContext, settings: ProgramSettings, *, image: str) -> bool:
    """Do this proxy's pods take lease users?"""
    return (
        settings.probe_pods is not None
        and ctx.credentials is not None
        and not threeproxy.is_threeproxy(image)
    )


def control_port(proxy_port: int) -> int:
    """The control port beside the proxy's own container port `proxy_port`."""
    return OTHER_CONTROL_PORT if proxy_port == CONTROL_PORT else CONTROL_PORT


def listen(proxy_port: int) -> str:
    """The forward proxy's `control` setting in a pod: every address of the pod."""
    return f"tcp://0.0.0.0:{control_port(proxy_port)}"


def service_name(proxy: ProgramProxy) -> str:
    """`<name>-control`, a DNS label of at most 63 characters (a long key's hash is kept)."""
    return physical_name("px", proxy, max_length=63 - len(SUFFIX)) + SUFFIX


def published(proxy: ProgramProxy, *, namespace: str, proxy_port: int) -> str:
    """The endpoint's `control` output: the headless Service's name, which resolves to every pod."""
    return f"tcp://{service_name(proxy)}.{namespace}.svc.cluster.local:{control_port(proxy_port)}"


def with_control(
    endpoint: ProxyEndpoint, proxy: ProgramProxy, *, namespace: str, proxy_port: int
) -> ControlledEndpoint:
    return ControlledEndpoint(
        **vars(endpoint), control=published(proxy, namespace=namespace, proxy_port=proxy_port)
    )


def container_port(proxy_port: int) -> dict[str, Any]:
    return {"name": "control", "containerPort": control_port(proxy_port), "protocol": "TCP"}


def service_pods(pods: ProbePods) -> dict[str, Any]:
    """A NetworkPolicy peer: the service's own pods."""
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": pods.namespace}},
        "podSelector": {"matchLabels": dict(pods.labels)},
    }


def ingress_rule(pods: ProbePods, *, proxy_port: int) -> dict[str, Any]:
    """The control port, from the service's pods only."""
    del proxy_port  # the port is named: each pod's own (they differ while a port change rolls)
    return {"from": [service_pods(pods)], "ports": [{"port": "control", "protocol": "TCP"}]}


def headless_service(
    proxy: ProgramProxy,
    *,
    meta: dict[str, Any],
    selector: dict[str, str],
    proxy_port: int,
    opts: pulumi.ResourceOptions,
) -> k8s.core.v1.Service:
    """No ClusterIP: the name resolves to each pod's address, ready or not (a pod that starts in a rollout
    must get the users of the leases answered meanwhile)."""
    spec = {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": selector,
        "ports": [
            {"name": "control", "port": control_port(proxy_port), "targetPort": "control", "protocol": "TCP"}
        ],
    }
    return k8s.core.v1.Service(
        f"{proxy.key}{SUFFIX}",
        metadata=cast(Any, {**meta, "name": service_name(proxy)}),
        spec=cast(Any, spec),
        opts=opts,
    )
