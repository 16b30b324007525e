"""A real single-node Kubernetes cluster for the tests, inside a network namespace of its own.

`running_node(workdir, say=...)` starts, in this order and each inside the node's namespaces
(tests/kube/node_host.py): etcd (namespace loopback), kube-apiserver (Node,RBAC on the node address),
containerd (the local pause and busybox images imported, tests/kube/images.py), kube-controller-manager,
kube-scheduler, the kubelet, kube-proxy (nftables mode), kube-router (NetworkPolicy only; a test-only part)
and CoreDNS (a process serving cluster.local on the node address; the kubelet gives pods that nameserver).
It yields a `KubeNode` once the Node is Ready, DNS answers and the default ServiceAccount exists. On leaving,
every program is stopped by pid (SIGTERM, then SIGKILL), then everything left in the namespace or the pods'
cgroups, and the host is put back (veth, nft table, cgroups, sysctls). A part that does not start raises
`NodeUnavailable` naming the part, with its log's tail.
"""

from __future__ import annotations

import fcntl
import shutil
import socket
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from kubernetes import config
from kubernetes.client import ApiClient, CoreV1Api, RbacAuthorizationV1Api
from kubernetes.client.exceptions import ApiException

from tests.kube.apiserver import TOOLS_BIN, ApiServerUnavailable, Child, answers, start, tls, wait_until
from tests.kube.images import BUSYBOX_IMAGE, PAUSE_IMAGE, ImageUnavailable, node_images
from tests.kube.node_config import (
    API_PORT,
    CNI_BIN,
    DNS_IP,
    HOST_IP,
    NODE_IP,
    NODE_NAME,
    POD_CIDR,
    READ_ONLY_ROLES,
    SERVICE_CIDR,
    NodeFiles,
    write_node_config,
)  # fmt: skip
from tests.kube.node_host import LOCK, HostSetupFailed, NodeNamespace, clear_stale
from tests.kube.node_programs import ORDER, flags

TOOLS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl",
         "kube-router", "coredns")  # fmt: skip
SYSTEM = {"etcd": "etcd-server", "containerd": "containerd", "ctr": "containerd", "runc": "runc",
          "nft": "nftables", "iptables": "iptables", "ipset": "ipset", "conntrack": "conntrack",
          "nsenter": "util-linux", "unshare": "util-linux", "ip": "iproute2"}  # fmt: skip
READY_TIMEOUT = 90.0
LOCK_WAIT = 900.0


class NodeUnavailable(RuntimeError):
    """A part of the node is missing or did not start; the message names it and gives its log's tail."""


@dataclass(frozen=True)
class KubeNode:
    """The running node: its admin kubeconfig, addresses and the logs of its programs."""

    files: NodeFiles
    kubeconfig: Path
    url: str
    logs: dict[str, Path]
    namespace: NodeNamespace
    ready_after: float  # seconds from the first program's start to the node being usable
    host_ip: str = HOST_IP  # test servers that pods should reach listen here
    node_ip: str = NODE_IP
    dns_ip: str = DNS_IP
    image: str = BUSYBOX_IMAGE

    def client(self) -> ApiClient:
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(self, *args: str) -> list[str]:
        return [str(TOOLS_BIN / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]

    def load_image(self, archive: Path, *, name: str) -> None:
        """Import an OCI archive into the node's containerd (no registry) and check it holds `name`, the
        reference pods use (imagePullPolicy IfNotPresent: the kubelet then never pulls)."""
        ctr = ["ctr", f"--address={self.files.containerd_socket}", "-n", "k8s.io", "images"]
        self.namespace.inside(*ctr, "import", str(archive))
        listed = self.namespace.inside(*ctr, "ls", "-q").split()
        if name not in listed:
            raise NodeUnavailable(f"{archive} holds no image {name} (the node has {', '.join(listed)})")


def binaries() -> dict[str, Path]:
    found: dict[str, Path] = {name: TOOLS_BIN / name for name in TOOLS if (TOOLS_BIN / name).exists()}
    missing = [f"{n} (make kube-tools)" for n in TOOLS if n not in found]
    for name, package in SYSTEM.items():
        path = shutil.which(name)
        if path:
            found[name] = Path(path)
        else:
            missing.append(f"{name} (Debian package {package}: make system-deps test set)")
    if not Path(CNI_BIN, "bridge").exists():
        missing.append(f"{CNI_BIN}/bridge (Debian package containernetworking-plugins)")
    if missing:
        raise NodeUnavailable("the test node cannot start, missing: " + ", ".join(missing))
    return found


@contextmanager
def running_node(workdir: Path, *, say: Callable[[str], None] = print) -> Iterator[KubeNode]:
    bins = binaries()
    try:
        images = node_images()
    except ImageUnavailable as exc:
        raise NodeUnavailable(f"the node's images cannot be made: {exc}") from exc
    with ExitStack() as stack:
        one_node_at_a_time(stack, say)
        for line in clear_stale():
            say(f"a killed session's node: {line}")
        namespace = NodeNamespace(workdir)
        stack.callback(_closer(namespace, say))
        try:
            namespace.create()
        except HostSetupFailed as exc:
            raise NodeUnavailable(f"the node's namespace and veth cannot be made: {exc}") from exc
        files = write_node_config(workdir, images={"pause": PAUSE_IMAGE})
        starter = Starter(stack=stack, namespace=namespace, bins=bins, files=files, say=say)
        try:
            node = starter.start_all(images=(images.pause, images.busybox))
        except HostSetupFailed as exc:  # a command inside the namespace (the image import)
            raise NodeUnavailable(f"the node cannot start: {exc}") from exc
        say(
            f"node {NODE_NAME} ready after {node.ready_after:.1f} s"
            f" (pods {POD_CIDR}, services {SERVICE_CIDR})"
        )
        yield node
        say("stopping the node")


def one_node_at_a_time(stack: ExitStack, say: Callable[[str], None]) -> None:
    """The node's veth, addresses and nft table have fixed names: a second session on the same machine
    (another clone, CI) waits for the first one's node to stop, for up to LOCK_WAIT seconds."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    handle = stack.enter_context(LOCK.open("w"))
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise NodeUnavailable(
                    f"another test node ran on this machine for over {LOCK_WAIT:.0f} s"
                ) from None
            if deadline - time.monotonic() > LOCK_WAIT - 1:
                say("another session's test node is running on this machine: waiting for it to stop")
            time.sleep(1)


def _closer(namespace: NodeNamespace, say: Callable[[str], None]) -> Callable[[], None]:
    def close() -> None:
        problems = namespace.close()
        say("host restored" if not problems else "host restore: " + "; ".join(problems))

    return close


@dataclass
class Starter:
    stack: ExitStack
    namespace: NodeNamespace
    bins: dict[str, Path]
    files: NodeFiles
    say: Callable[[str], None]

    def start_all(self, *, images: tuple[Path, ...]) -> KubeNode:
        started = time.monotonic()
        f = self.files
        url, token = f"https://{NODE_IP}:{API_PORT}", _token(f, "admin")
        etcd = self.run("etcd")
        self.ready(etcd, lambda: "serving client traffic" in etcd.log.read_text(errors="replace"))
        api = self.run("kube-apiserver")
        self.ready(
            api, lambda: f.ca_file.exists() and answers(f"{url}/readyz", verify=tls(f.ca_file), token=token)
        )
        containerd = self.run("containerd")
        ctr = [str(self.bins["ctr"]), f"--address={f.containerd_socket}"]
        self.ready(containerd, lambda: f.containerd_socket.exists() and self.succeeds(*ctr, "version"))
        for image in images:
            self.namespace.inside(*ctr, "-n", "k8s.io", "images", "import", str(image))
        self.run("kube-controller-manager")
        self.run("kube-scheduler")
        kubelet = self.run("kubelet")
        with admin_client(f.kubeconfigs["admin"]) as client:
            grant_read_only_roles(client)
            core = CoreV1Api(client)
            self.ready(kubelet, lambda: node_ready(core), timeout=READY_TIMEOUT)
            proxy = self.run("kube-proxy")
            self.ready(
                proxy, lambda: self.succeeds(str(self.bins["nft"]), "list", "table", "ip", "kube-proxy")
            )
            router = self.run("kube-router")  # after the Node exists, else it exits
            self.ready(router, lambda: self.succeeds(str(self.bins["iptables"]), "-S", "KUBE-ROUTER-FORWARD"))
            dns = self.run("coredns")
            self.ready(
                dns, lambda: resolves("kubernetes.default.svc.cluster.local", server=DNS_IP) is not None
            )
            wait_for(lambda: has_service_account(core), what="the default ServiceAccount")
        logs = {name: f.workdir / "logs" / f"{name}.log" for name in ORDER}
        return KubeNode(
            files=f, kubeconfig=f.kubeconfigs["admin"], url=url, logs=logs, namespace=self.namespace,
            ready_after=time.monotonic() - started,
        )  # fmt: skip

    def run(self, name: str) -> Child:
        logdir = self.files.workdir / "logs"
        logdir.mkdir(exist_ok=True)
        argv = [*self.namespace.enter(), str(self.bins[name]), *flags(name, self.files)]
        child = start(self.stack, name=name, argv=argv, workdir=logdir)
        self.say(f"started {name} (pid {child.process.pid})")
        return child

    def ready(self, child: Child, check: Callable[[], bool], *, timeout: float = 60.0) -> None:
        try:
            wait_until(child, check, timeout=timeout)
        except ApiServerUnavailable as exc:
            raise NodeUnavailable(f"the node's {exc}") from exc

    def succeeds(self, *argv: str) -> bool:
        try:
            self.namespace.inside(*argv)
        except HostSetupFailed:
            return False
        return True


def admin_client(kubeconfig: Path) -> ApiClient:
    return config.new_client_from_config(config_file=str(kubeconfig))


def grant_read_only_roles(client: ApiClient) -> None:
    """kube-router's and CoreDNS's own ClusterRoles and bindings (READ_ONLY_ROLES), not system:masters."""
    rbac = RbacAuthorizationV1Api(client)
    for user, rules in READ_ONLY_ROLES.items():
        name = user.replace(":", "-")
        rbac.create_cluster_role({"metadata": {"name": name}, "rules": rules})
        subject = {"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}
        role_ref = {"kind": "ClusterRole", "name": name, "apiGroup": "rbac.authorization.k8s.io"}
        rbac.create_cluster_role_binding(
            {"metadata": {"name": name}, "subjects": [subject], "roleRef": role_ref}
        )


def _token(files: NodeFiles, user: str) -> str:
    for line in files.tokens.read_text().splitlines():
        token, name, *_ = line.split(",")
        if name == user:
            return token
    raise KeyError(user)


def node_ready(core: CoreV1Api) -> bool:
    try:
        node = core.read_node(NODE_NAME)
    except ApiException:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def has_service_account(core: CoreV1Api) -> bool:
    try:
        core.read_namespaced_service_account("default", "default")
    except ApiException:
        return False
    return True


def wait_for(check: Callable[[], bool], *, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise NodeUnavailable(f"{what} did not appear within {timeout:.0f} s")
        time.sleep(0.2)


def resolves(name: str, *, server: str, timeout: float = 1.0) -> str | None:
    """The first A record of `name` from the DNS server at `server`:53 (one UDP query), or None."""
    query = struct.pack(">HHHHHH", 0x504F, 0x0100, 1, 0, 0, 0)
    query += (
        b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
    )
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.sendto(query, (server, 53))
            answer = sock.recv(512)
        except OSError:
            return None
    if len(answer) < 12 or answer[3] & 0x0F or struct.unpack(">H", answer[6:8])[0] == 0:
        return None
    at = skip_name(answer, 12) + 4  # past the echoed question (name, type, class)
    at = skip_name(answer, at)  # the first answer's name (a pointer or labels)
    kind, _, _, length = struct.unpack(">HHIH", answer[at : at + 10])
    return socket.inet_ntoa(answer[at + 10 : at + 14]) if kind == 1 and length == 4 else None


def skip_name(message: bytes, at: int) -> int:
    while message[at] and message[at] < 0xC0:
        at += message[at] + 1
    return at + (2 if message[at] >= 0xC0 else 1)
