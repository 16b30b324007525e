"""Proxy pods carry traffic: the kubernetes program, the real engine and plugin, the service's own image, the
test node (tests/kube/node.py) with its kubelet, kube-proxy, CoreDNS and kube-router enforcing NetworkPolicy.

The service runs here, on the host, driven over a manifests folder (the folder mode's controller); it reaches
the node's API server, pod and Service addresses over the node's veth. Test web servers listen on the host's
veth address, which pods reach and which is a private address: the Proxies allow it explicitly, on one port.
Requests go to the Service's ClusterIP (the host cannot resolve cluster DNS names; the service-as-a-pod tests
use the published name).
"""

from __future__ import annotations

import asyncio
import base64
import http.server
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from kubernetes.client import ApiClient, CoreV1Api

from service.controller import Controller
from tests.kube.node import KubeNode
from tests.kube.pods import probe_command, run_to_end, witness
from tests.kube.program_fleet import ClusterObjects, KubeFleet
from tests.ports import free_port

pytestmark = [pytest.mark.node, pytest.mark.engine]
BODY = b"through the pod"


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *_: Any) -> None:
        pass


@contextmanager
def web_server(host: str, port: int) -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer((host, port), _Page)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="web", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def allow_host(kube_node: KubeNode, port: int) -> dict[str, Any]:
    return {"allow": [{"cidr": f"{kube_node.host_ip}/32", "ports": [port]}]}


def condition(controller: Controller, key: str, type_: str) -> Any:
    return next(c for c in controller.status.get(key).conditions if c.type == type_)


def credentials(controller: Controller, key: str) -> tuple[str, str]:
    endpoint = {e.key: e for e in controller.inventory.endpoints()}[key]
    assert endpoint.username
    assert endpoint.password
    return endpoint.username, endpoint.password


def cluster_ip(objects: ClusterObjects, name: str) -> str:
    return str(objects.service(name).spec.cluster_ip)


def via(user: str | None, password: str | None, address: str, port: int) -> httpx.Client:
    auth = f"{user}:{password}@" if user else ""
    return httpx.Client(proxy=f"http://{auth}{address}:{port}", timeout=10, trust_env=False)


def connect(address: str, port: int, target: str, *, user: str, password: str) -> bytes:
    """A CONNECT tunnel through the proxy, a GET sent inside it; what came back (status line first)."""
    with socket.create_connection((address, port), timeout=10) as sock:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {token}\r\n"
        sock.sendall(f"{request}\r\n".encode())
        head = _read_head(sock)
        if not head.startswith(b"HTTP/1.1 200"):
            return head
        sock.sendall(f"GET / HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n".encode())
        return head + _read_all(sock)


def socks(address: str, port: int, host: str, target: int, *, user: str, password: str) -> bytes:
    """A SOCKS5 CONNECT with a username/password login, a GET sent inside it; what came back."""
    with socket.create_connection((address, port), timeout=10) as sock:
        sock.sendall(b"\x05\x01\x02")
        assert sock.recv(2) == b"\x05\x02"
        sock.sendall(bytes([1, len(user)]) + user.encode() + bytes([len(password)]) + password.encode())
        assert sock.recv(2) == b"\x01\x00"
        sock.sendall(b"\x05\x01\x00\x01" + socket.inet_aton(host) + struct.pack("!H", target))
        reply = sock.recv(10)
        if reply[1:2] != b"\x00":
            return reply
        sock.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        return _read_all(sock)


def _read_head(sock: socket.socket) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        if not chunk:
            break
        head += chunk
    return head


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def answered(call: Any, *, within: float = 20.0) -> Any:
    """`call()` once kube-proxy has the Service's rules (a new ClusterIP takes it a moment)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return call()
        except (httpx.TransportError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def test_a_proxy_pod_carries_traffic_to_what_its_policy_allows_and_nothing_else(
    kube_node: KubeNode,
    node_fleet: KubeFleet,
    node_objects: ClusterObjects,
    node_api: ApiClient,
    node_target: str,
) -> None:
    """HTTP (plain and CONNECT) and SOCKS5 through pods running the forward proxy from the service's image:
    the allowed destination answers; no credentials is a 407; a destination the policy refuses is refused
    by the proxy (a 403 with Proxy-Status), and by the NetworkPolicy for anything else in the pod."""
    allowed, refused = free_port(), free_port()
    node_fleet.write_proxy("web", port=8080, egress=allow_host(kube_node, allowed))
    node_fleet.write_proxy("sock", port=1080, protocol="socks5", egress=allow_host(kube_node, allowed))
    host = kube_node.host_ip
    results: dict[str, Any] = {}

    async def scenario() -> None:
        controller = await node_fleet.apply()
        for key in ("crawl/web", "crawl/sock"):
            assert condition(controller, key, "Provisioned").status == "True", controller.status.get(key)
            results[key] = credentials(controller, key)

    with web_server(host, allowed), witness(host, refused) as other:
        asyncio.run(node_fleet.run(scenario))
        web, sock = cluster_ip(node_objects, "px-crawl-web"), cluster_ip(node_objects, "px-crawl-sock")
        user, password = results["crawl/web"]
        with via(user, password, web, 8080) as client:
            page = answered(lambda: client.get(f"http://{host}:{allowed}/"))
            assert (page.status_code, page.content) == (200, BODY)
            denied = client.get(f"http://{host}:{refused}/")
            assert denied.status_code == 403
            assert "destination_ip_prohibited" in denied.headers.get("proxy-status", ""), denied.headers
        with via(None, None, web, 8080) as anonymous:
            assert anonymous.get(f"http://{host}:{allowed}/").status_code == 407
        tunnel = connect(web, 8080, f"{host}:{allowed}", user=user, password=password)
        assert tunnel.startswith(b"HTTP/1.1 200"), tunnel
        assert tunnel.endswith(BODY), tunnel
        assert b" 403 " in connect(web, 8080, f"{host}:{refused}", user=user, password=password)[:20]
        sock_user, sock_password = results["crawl/sock"]
        reply = answered(lambda: socks(sock, 1080, host, allowed, user=sock_user, password=sock_password))
        assert reply.endswith(BODY), reply
        assert socks(sock, 1080, host, refused, user=sock_user, password=sock_password)[1:2] == b"\x02"
        assert not other.peers, "the proxy refused before dialling"

        # The NetworkPolicy on its own: a pod with the proxy pod's labels reaches the allowed port only.
        core = CoreV1Api(node_api)
        labels = node_objects.deployment("px-crawl-web").spec.selector.match_labels
        code, log, _ = run_to_end(
            core, node_target, "as-proxy-ok", command=probe_command(host, allowed), labels=labels
        )
        assert code == 0, log
        code, log, held = run_to_end(
            core, node_target, "as-proxy-no", command=probe_command(host, refused), labels=labels
        )
        assert code != 0, log
        assert held.status.pod_ip not in other.peers
