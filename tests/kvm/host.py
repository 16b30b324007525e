"""A real KVM host for the tests: libvirtd, virtlogd and sshd in a network namespace of their own.

`running_kvm_host(workdir)` takes the machine-wide lock (one test KVM host at a time), clears what a killed
session left, makes the namespace (tests/kvm/namespace.py), then starts inside it, each by pid and in the
foreground: virtlogd, libvirtd (the copied /etc/libvirt, QEMU as root, no cgroups), and sshd on NS_IP:2222
with a host key of its own, key-only. Through a local connection (libvirtd's socket, reached under
/proc/HOLDER/root) it starts libvirt's `default` NAT network and a `dir` pool `default` in the work folder.
It yields a `KvmHost`: the qemu+libssh URI the service under test uses (it reaches libvirtd only through
that sshd, from the host's side of the veth), the key and known_hosts, and `inside()` to run commands in the
namespace (guests' 192.168.122.0/24 is reachable only there).

On leaving: every domain is destroyed and undefined, the network stopped, sshd, libvirtd and virtlogd
stopped by pid (SIGTERM, then SIGKILL), everything left in the namespace killed by pid, and the veth and nft
table removed (`KvmNamespace.close`). A part missing or refusing to start raises `KvmHostUnavailable` saying
what to do; the tests fail on it, never skip.
"""

from __future__ import annotations

import fcntl
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.kube.apiserver import ApiServerUnavailable, Child, start, wait_until
from tests.kube.node_host import HostSetupFailed
from tests.kvm.host_config import (
    NETWORK,
    NETWORK_XML,
    POOL,
    SSH_PORT,
    SSH_USER,
    HostFiles,
    pool_xml,
    write_host_files,
)
from tests.kvm.namespace import LOCK, NS_IP, KvmNamespace, clear_stale

PROGRAMS = {"libvirtd": "libvirt-daemon-system", "virtlogd": "libvirt-daemon-system",
            "virt-ssh-helper": "libvirt-daemon", "qemu-system-x86_64": "qemu-system-x86",
            "qemu-img": "qemu-utils", "dnsmasq": "dnsmasq-base", "sshd": "openssh-server",
            "ssh-keygen": "openssh-client", "genisoimage": "genisoimage", "nsenter": "util-linux",
            "unshare": "util-linux", "ip": "iproute2", "nft": "nftables", "iptables": "iptables"}  # fmt: skip
LOCK_WAIT = 900.0
LOCAL_SOCKET = "/run/libvirt/libvirt-sock"


class KvmHostUnavailable(RuntimeError):
    """A part of the test KVM host is missing or did not start; the message says which and what to do."""


@dataclass(frozen=True)
class KvmHost:
    """How the service under test reaches the host, and how a test looks inside it."""

    files: HostFiles
    namespace: KvmNamespace
    ready_after: float
    address: str = NS_IP
    port: int = SSH_PORT
    user: str = SSH_USER
    network: str = NETWORK
    pool: str = POOL

    @property
    def key(self) -> Path:
        return self.files.key

    @property
    def known_hosts(self) -> Path:
        return self.files.known_hosts

    def uri(self, *, known_hosts: Path | None = None) -> str:
        """The qemu+libssh URI with host key verification on (known_hosts: another file to verify with)."""
        return (
            f"qemu+libssh://{self.user}@{self.address}:{self.port}/system?keyfile={self.key}"
            f"&known_hosts={known_hosts or self.known_hosts}&known_hosts_verify=normal&sshauth=privkey"
        )

    @property
    def catalogue_uri(self) -> str:
        """The URI as a catalogue writes it (`qemu+ssh://user@host:port/system`)."""
        return f"qemu+ssh://{self.user}@{self.address}:{self.port}/system"

    @property
    def local_uri(self) -> str:
        """libvirtd's own socket, for the fixture's setup and checks (not the service's way in)."""
        return f"qemu+unix:///system?socket={self.namespace.path(LOCAL_SOCKET)}"

    def inside(self, *argv: str, stdin: str | None = None) -> str:
        """Run a command in the host's namespaces; its output, or HostSetupFailed with its stderr."""
        return self.namespace.inside(*argv, stdin=stdin)

    def enter(self) -> list[str]:
        return self.namespace.enter()


def libvirt_module() -> Any:
    try:
        import libvirt
    except ImportError as exc:
        raise KvmHostUnavailable(
            "libvirt-python is not installed: run `make kvm-python` (the [kvm] extra; needs `make kvm-deps`)"
        ) from exc
    libvirt.registerErrorHandler(lambda *_: None, None)  # errors arrive as exceptions, not on stderr
    return libvirt


def missing_programs() -> list[str]:
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return [
        f"{name} (Debian package {pkg})"
        for name, pkg in PROGRAMS.items()
        if not shutil.which(name, path=path)
    ]


@contextmanager
def running_kvm_host(workdir: Path, *, say: Callable[[str], None] = print) -> Iterator[KvmHost]:
    if missing := missing_programs():
        raise KvmHostUnavailable(
            f"the test KVM host cannot start, missing: {', '.join(missing)}: run `make kvm-deps`"
        )
    libvirt = libvirt_module()
    with ExitStack() as stack:
        one_host_at_a_time(stack, say)
        for line in clear_stale():
            say(f"a killed session's KVM host: {line}")
        started = time.monotonic()
        files = write_host_files(workdir)
        namespace = KvmNamespace(workdir)
        stack.callback(_closer(namespace, say))
        try:
            namespace.create(etc_libvirt=files.etc_libvirt)
        except HostSetupFailed as exc:
            raise KvmHostUnavailable(f"the KVM host's namespace and veth cannot be made: {exc}") from exc
        host = KvmHost(files=files, namespace=namespace, ready_after=0.0)
        daemons = Daemons(stack=stack, host=host, say=say)
        daemons.start_all()
        conn = daemons.connect(libvirt)
        stack.callback(conn.close)
        stack.callback(lambda: remove_domains(conn, say))
        prepare(conn, files)
        host = KvmHost(files=files, namespace=namespace, ready_after=time.monotonic() - started)
        say(
            f"KVM host ready after {host.ready_after:.1f} s: {host.catalogue_uri}"
            f" (libvirt {conn.getLibVersion()})"
        )
        yield host
        say("stopping the KVM host")


def one_host_at_a_time(stack: ExitStack, say: Callable[[str], None]) -> None:
    """The veth, addresses and nft table have fixed names: a second session waits for the first."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    handle = stack.enter_context(LOCK.open("w"))
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise KvmHostUnavailable(f"another test KVM host ran for over {LOCK_WAIT:.0f} s") from None
            if deadline - time.monotonic() > LOCK_WAIT - 1:
                say("another session's test KVM host is running on this machine: waiting for it to stop")
            time.sleep(1)


def _closer(namespace: KvmNamespace, say: Callable[[str], None]) -> Callable[[], None]:
    def close() -> None:
        problems = namespace.close()
        if problems:  # the session fails: a test host must leave the machine as it found it
            raise KvmHostUnavailable("the test KVM host left: " + "; ".join(problems))
        say("KVM host gone, host restored")

    return close


@dataclass
class Daemons:
    stack: ExitStack
    host: KvmHost
    say: Callable[[str], None]

    def start_all(self) -> None:
        ns, files = self.host.namespace, self.host.files
        ns.inside("mkdir", "-p", "/run/sshd", "/run/libvirt", "/var/log/libvirt/qemu")
        virtlogd = self.run("virtlogd", "/usr/sbin/virtlogd")
        self.ready(virtlogd, lambda: ns.path("/run/libvirt/virtlogd-sock").exists())
        libvirtd = self.run("libvirtd", "/usr/sbin/libvirtd")
        self.ready(libvirtd, lambda: ns.path(LOCAL_SOCKET).exists())
        sshd = self.run("sshd", "/usr/sbin/sshd", "-D", "-e", "-f", str(files.sshd_config))
        self.ready(sshd, lambda: answers(NS_IP, SSH_PORT))

    def run(self, name: str, *argv: str) -> Child:
        child = start(self.stack, name=name, argv=[*self.host.enter(), *argv], workdir=self.host.files.logs)
        self.say(f"started {name} (pid {child.process.pid})")
        return child

    def ready(self, child: Child, check: Callable[[], bool]) -> None:
        try:
            wait_until(child, check, timeout=30)
        except ApiServerUnavailable as exc:
            raise KvmHostUnavailable(f"the KVM host's {exc}") from exc

    def connect(self, libvirt: Any) -> Any:
        uri = self.host.local_uri
        deadline = time.monotonic() + 30
        while True:
            try:
                return libvirt.open(uri)
            except libvirt.libvirtError as exc:
                if time.monotonic() > deadline:
                    raise KvmHostUnavailable(f"libvirtd does not answer on {uri}: {exc}") from exc
                time.sleep(0.2)


def prepare(conn: Any, files: HostFiles) -> None:
    """libvirt's default NAT network, started, and the `dir` pool in the work folder."""
    network = conn.networkDefineXML(NETWORK_XML)
    try:
        network.create()
    except Exception as exc:
        raise KvmHostUnavailable(f"libvirt's {NETWORK} network does not start: {exc}") from exc
    pool = conn.storagePoolDefineXML(pool_xml(files.pool_dir))
    pool.create()


def remove_domains(conn: Any, say: Callable[[str], None]) -> None:
    """Before the daemons stop: no guest outlives its host (QEMU is killed by pid afterwards anyway)."""
    for domain in conn.listAllDomains():
        if domain.isActive():
            domain.destroy()
        domain.undefine()
        say(f"removed the domain {domain.name()}")
    for network in conn.listAllNetworks():
        if network.isActive():
            network.destroy()  # libvirt stops its dnsmasq and removes virbr0 and its rules


def answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False
