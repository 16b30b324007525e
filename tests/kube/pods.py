"""Small helpers for tests that run pods on the test node (tests/kube/test_node.py).

The pods use the node's local busybox image (`imagePullPolicy: Never`: there is no registry) and, unless told
otherwise, the kubernetes program's own security context (`program_security()`, read from
stacks/programs/kubernetes.py so a change there is what these tests run). `TcpWitness` is a test server that
answers one byte and remembers who connected.
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, TypeVar

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from stacks.programs import kubernetes as program
from tests.kube.images import BUSYBOX_IMAGE

POD_TIMEOUT = 60.0


def program_security() -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod and container securityContext the kubernetes program gives a proxy pod."""
    ctx = SimpleNamespace(proxy=SimpleNamespace(spec=SimpleNamespace(port=8080)))
    container = program._container(ctx, SimpleNamespace(image=BUSYBOX_IMAGE, resources={}), control=False)  # type: ignore[arg-type]
    return {"runAsNonRoot": True, "fsGroup": program.RUN_AS}, container["securityContext"]


def pod_manifest(
    name: str, *, command: list[str], labels: dict[str, str] | None = None, restart: str = "Never"
) -> dict[str, Any]:
    pod_security, container_security = program_security()
    container: dict[str, Any] = {
        "name": "main",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": command,
        "securityContext": container_security,
    }
    spec = {
        "restartPolicy": restart,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 1,
        "securityContext": pod_security,
        "containers": [container],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


def wait_pod(core: CoreV1Api, namespace: str, name: str, *, until: str, timeout: float = POD_TIMEOUT) -> Any:
    """The pod once it is `until` ("Ready", or "Done": Succeeded/Failed); else AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        pod = core.read_namespaced_pod(name, namespace)
        phase = pod.status.phase
        ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
        if (until == "Done" and phase in ("Succeeded", "Failed")) or (until == "Ready" and ready):
            return pod
        if time.monotonic() > deadline:
            raise AssertionError(f"pod {namespace}/{name} not {until} after {timeout:.0f} s: {pod.status}")
        time.sleep(0.2)


def run_to_end(
    core: CoreV1Api, namespace: str, name: str, *, command: list[str], labels: dict[str, str] | None = None
) -> tuple[int, str, Any]:
    """Run a pod to its end: its container's exit code, its log and the pod."""
    core.create_namespaced_pod(namespace, pod_manifest(name, command=command, labels=labels))
    pod = wait_pod(core, namespace, name, until="Done")
    state = pod.status.container_statuses[0].state.terminated
    return state.exit_code, core.read_namespaced_pod_log(name, namespace), pod


def create_namespace(core: CoreV1Api, namespace: str, *, timeout: float = 30.0) -> None:
    """A namespace that pods can run in: once the controller-manager gave it its default ServiceAccount."""
    core.create_namespace({"metadata": {"name": namespace}})
    deadline = time.monotonic() + timeout
    while not core.list_namespaced_service_account(namespace).items:
        assert time.monotonic() < deadline, f"namespace {namespace} got no default ServiceAccount"
        time.sleep(0.2)


def delete_namespace(core: CoreV1Api, namespace: str) -> None:
    try:
        core.delete_namespace(namespace, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise


def probe_command(host: str, port: int, *, settle: float = 2.0, tries: int = 3) -> list[str]:
    """A shell line that exits 0 at the first of `tries` connections to host:port (2 s timeout each) that
    works, after `settle` seconds (kube-router applies a policy shortly after the pod gets its address)."""
    attempt = f"nc -w 2 {host} {port} </dev/null"
    return ["sh", "-c", f"sleep {settle}; for i in $(seq {tries}); do {attempt} && exit 0; done; exit 1"]


class TcpWitness(socketserver.ThreadingTCPServer):
    """Answers one byte to every connection and records the peers' addresses."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int) -> None:
        self.peers: list[str] = []
        super().__init__((host, port), _Handler)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, TcpWitness)
        server.peers.append(self.client_address[0])
        self.request.sendall(b"w")


Served = TypeVar("Served", bound=socketserver.BaseServer)


@contextmanager
def serving(server: Served, name: str) -> Iterator[Served]:
    """`server` answering in a thread of its own until the block ends; then shut down and closed."""
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def witness(host: str, port: int) -> Iterator[TcpWitness]:
    with serving(TcpWitness(host, port), "witness") as server:
        yield server


def outside_address() -> str:
    """The host's own address on its default-route interface (what a pod must never reach)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("1.1.1.1", 53))  # UDP connect sends nothing: it only picks the default route's source
        return str(sock.getsockname()[0])
