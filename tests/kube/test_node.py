"""Pods really run on the test node (tests/kube/node.py): the image, the program's security context, pod and
Service addresses, cluster DNS, NetworkPolicy egress, and that no pod reaches anything outside the node.

Every test here needs the `kube_node` session fixture, which fails (never skips) when a part cannot start.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kubernetes.client import CoreV1Api, NetworkingV1Api

from stacks.programs import kubernetes as program
from tests.kube import node as node_module
from tests.kube.images import SERVED_BYTE
from tests.kube.node import KubeNode, NodeUnavailable
from tests.kube.pods import (
    delete_namespace,
    outside_address,
    pod_manifest,
    probe_command,
    run_to_end,
    wait_pod,
    witness,
)  # fmt: skip

pytestmark = pytest.mark.node
WEB_PORT = 8080


@pytest.fixture
def core(kube_node: KubeNode) -> Iterator[CoreV1Api]:
    with kube_node.client() as client:
        yield CoreV1Api(client)


@pytest.fixture
def namespace(core: CoreV1Api) -> Iterator[str]:
    name = f"t-{secrets.token_hex(4)}"
    core.create_namespace({"metadata": {"name": name}})
    deadline = time.monotonic() + 30  # pods need the namespace's default ServiceAccount
    while not core.list_namespaced_service_account(name).items and time.monotonic() < deadline:
        time.sleep(0.1)
    yield name
    delete_namespace(core, name)


def web_pod(core: CoreV1Api, namespace: str) -> str:
    """A busybox httpd with the program's security context serving SERVED_BYTE; its pod IP once Ready."""
    manifest = pod_manifest("web", command=["httpd", "-f", "-p", str(WEB_PORT), "-h", "/www"],
                            labels={"app": "web"}, restart="Always")  # fmt: skip
    manifest["spec"]["containers"][0]["readinessProbe"] = {
        "tcpSocket": {"port": WEB_PORT},
        "periodSeconds": 1,
    }
    core.create_namespaced_pod(namespace, manifest)
    return str(wait_pod(core, namespace, "web", until="Ready").status.pod_ip)


def web_service(core: CoreV1Api, namespace: str) -> str:
    spec = {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": WEB_PORT}]}
    service = core.create_namespaced_service(namespace, {"metadata": {"name": "web"}, "spec": spec})
    return str(service.spec.cluster_ip)


def fetch(url: str, *, within: float = 20.0) -> bytes:
    """GET url, retried until it answers (a new Service takes kube-proxy a moment)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return httpx.get(url, timeout=2).content
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def test_pod_with_the_programs_security_context_serves_over_its_ip_and_a_cluster_ip(
    kube_node: KubeNode, core: CoreV1Api, namespace: str
) -> None:
    pod_ip = web_pod(core, namespace)
    cluster_ip = web_service(core, namespace)

    assert fetch(f"http://{pod_ip}:{WEB_PORT}/") == SERVED_BYTE
    assert fetch(f"http://{cluster_ip}/") == SERVED_BYTE
    container = core.read_namespaced_pod("web", namespace).spec.containers[0].security_context
    assert (container.run_as_user, container.read_only_root_filesystem) == (program.RUN_AS, True)
    assert container.capabilities.drop == ["ALL"]
    assert container.seccomp_profile.type == "RuntimeDefault"
    # inside, as the kernel sees it (kubectl exec: apiserver -> kubelet with the client certificate)
    shell = "id -u; id -g; touch /tmp/x 2>/dev/null && echo WROTE; grep CapEff /proc/1/status"
    seen = subprocess.run(kube_node.kubectl("exec", "-n", namespace, "web", "--", "sh", "-c", shell),
                          capture_output=True, text=True, timeout=30, check=True).stdout.split()  # fmt: skip
    assert seen[:2] == [str(program.RUN_AS)] * 2  # uid and gid
    assert "WROTE" not in seen  # read-only root: even the image's world-writable /tmp refuses a write
    assert seen[-1] == "0000000000000000"  # no capability at all


def test_a_service_name_resolves_inside_a_pod(core: CoreV1Api, namespace: str) -> None:
    web_pod(core, namespace)
    cluster_ip = web_service(core, namespace)
    name = f"web.{namespace}.svc.cluster.local"

    code, log, _ = run_to_end(core, namespace, "lookup", command=["nslookup", name])
    assert code == 0, log
    assert cluster_ip in log, log
    missing = f"nosuch.{namespace}.svc.cluster.local"
    code, log, _ = run_to_end(core, namespace, "nosuch", command=["nslookup", missing])
    assert code != 0, log


def test_a_network_policy_denying_egress_stops_a_pod(
    kube_node: KubeNode, core: CoreV1Api, namespace: str
) -> None:
    deny = {"podSelector": {"matchLabels": {"role": "blocked"}}, "policyTypes": ["Egress"], "egress": []}
    with kube_node.client() as client:
        NetworkingV1Api(client).create_namespaced_network_policy(
            namespace, {"metadata": {"name": "deny-egress"}, "spec": deny}
        )
    with witness(kube_node.host_ip, 33401) as server:
        command = probe_command(kube_node.host_ip, 33401)
        allowed, log, free = run_to_end(core, namespace, "free", command=command, labels={"role": "free"})
        assert allowed == 0, log
        assert free.status.pod_ip in server.peers
        blocked, log, held = run_to_end(core, namespace, "held", command=command, labels={"role": "blocked"})
        assert blocked != 0, log
        assert held.status.pod_ip not in server.peers


def test_no_pod_reaches_an_address_outside_the_node(
    kube_node: KubeNode, core: CoreV1Api, namespace: str
) -> None:
    outside = outside_address()  # the host's own default-route address: reachable if anything leaks out
    with witness(outside, 33402) as server:
        # each connection must fail fast ("network unreachable": the node has no route out), well before
        # nc's 2 s timeout; 1.1 s apart, as the kernel sends at most one such ICMP error a second to a host
        targets = f"{outside}:33402 1.1.1.1:80"
        attempt = "nc -w 2 ${t%:*} ${t#*:} </dev/null && echo REACHED $t; sleep 1.1"
        line = f"for t in {targets}; do {attempt}; done"
        started = time.monotonic()
        code, log, _ = run_to_end(core, namespace, "leak", command=["sh", "-c", line + "; true"])
        assert code == 0, log
        assert "REACHED" not in log, log
        assert server.peers == []
        assert log.count("unreachable") == 2, log
    assert time.monotonic() - started < 30


def test_a_missing_part_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without the node's programs the fixture fails saying which and how to get them (no node needed)."""
    monkeypatch.setattr(node_module, "TOOLS_BIN", tmp_path)
    with pytest.raises(NodeUnavailable, match=r"kubelet \(make kube-tools\).*coredns \(make kube-tools\)"):
        node_module.binaries()
