"""What the kvm tests check from inside the test host's namespace (the only place a guest is reachable):
a request through a proxy, and what libvirtd holds (read over its own socket, not the service's way in)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.kvm.host import KvmHost
from tests.kvm.host_config import keygen, known_hosts_line
from tests.kvm.namespace import NS_IP

BRIDGE_IP = "192.168.122.1"  # the namespace's side of libvirt's NAT network: the guests reach it
REFUSED_IP = NS_IP  # the same namespace, on its veth: a private address the default policy refuses
SITE_PORT = 8089
REQUEST = """import base64, http.client, sys
proxy, port, url, creds = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
conn = http.client.HTTPConnection(proxy, port, timeout=20)
headers = {"Proxy-Authorization": "Basic " + base64.b64encode(creds.encode()).decode()} if creds else {}
conn.request("GET", url, headers=headers)
print(conn.getresponse().status)
"""


def through(host: KvmHost, *, proxy: str, port: int, url: str, creds: str = "") -> int:
    """The status a request for `url` through the proxy gets, sent from inside the namespace."""
    return int(host.inside(sys.executable, "-c", REQUEST, proxy, str(port), url, creds).strip())


@contextmanager
def site(host: KvmHost) -> Iterator[int]:
    """A web server inside the namespace, on every address there (the bridge and the veth)."""
    server = subprocess.Popen(
        [*host.enter(), sys.executable, "-m", "http.server", "--bind", "0.0.0.0", str(SITE_PORT)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield SITE_PORT
    finally:
        server.terminate()
        server.wait(timeout=10)


class HostView:
    """What is on the host, read through libvirtd's own socket."""

    def __init__(self, libvirt: Any, host: KvmHost) -> None:
        self.libvirt = libvirt
        self.host = host

    @contextmanager
    def conn(self) -> Iterator[Any]:
        conn = self.libvirt.open(self.host.local_uri)
        try:
            yield conn
        finally:
            conn.close()

    def domains(self) -> dict[str, Any]:
        """Running or defined domains: name -> (UUID, active, memory MiB). A domain undefined between the
        list and its own questions (the service replacing a VM meanwhile) is left out, as a later list
        would: the cold run of 2026-12-06 failed on such a race (virDomainIsActive: domain not found)."""
        found: dict[str, Any] = {}
        with self.conn() as conn:
            for d in conn.listAllDomains():
                try:
                    found[d.name()] = (d.UUIDString(), bool(d.isActive()), d.maxMemory() // 1024)
                except self.libvirt.libvirtError as exc:
                    if exc.get_error_code() != self.libvirt.VIR_ERR_NO_DOMAIN:
                        raise
        return found

    def address(self, name: str) -> str | None:
        """The domain's IPv4 address from its DHCP lease, None while it has none (or no domain)."""
        with self.conn() as conn:
            try:
                domain = conn.lookupByName(name)
                found = domain.interfaceAddresses(self.libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE, 0)
            except self.libvirt.libvirtError:
                return None
        for interface in found.values():
            for address in interface.get("addrs") or []:
                if address["type"] == self.libvirt.VIR_IP_ADDR_TYPE_IPV4:
                    return str(address["addr"])
        return None

    def volumes(self) -> set[str]:
        with self.conn() as conn:
            pool = conn.storagePoolLookupByName(self.host.pool)
            pool.refresh(0)
            return set(pool.listVolumes())

    def remove_domain(self, name: str) -> None:
        """What an operator does by hand: `virsh destroy` + `virsh undefine`."""
        with self.conn() as conn:
            domain = conn.lookupByName(name)
            if domain.isActive():
                domain.destroy()
            domain.undefine()

    def clean(self, *, domains_prefix: str, keep_volumes: set[str]) -> None:
        """Remove what a test left: its domains, and every volume that was not there before it."""
        with self.conn() as conn:
            for domain in conn.listAllDomains():
                if domain.name().startswith(domains_prefix):
                    if domain.isActive():
                        domain.destroy()
                    domain.undefine()
            pool = conn.storagePoolLookupByName(self.host.pool)
            pool.refresh(0)
            for name in set(pool.listVolumes()) - keep_volumes:
                pool.storageVolLookupByName(name).delete(0)


def ssh_dir(host: KvmHost, folder: Path, *, right_key: bool) -> Path:
    """The kvm-ssh Secret's two files as the service mounts them; when not `right_key`, a known_hosts that
    records another key for the host's own address and port (a refused key, not an unknown host)."""
    folder.mkdir()
    (folder / "id_ed25519").write_bytes(host.key.read_bytes())
    (folder / "id_ed25519").chmod(0o600)
    if right_key:
        (folder / "known_hosts").write_text(host.known_hosts.read_text())
    else:
        keygen(folder / "other", comment="not-the-host")
        (folder / "known_hosts").write_text(known_hosts_line(folder / "other.pub", host=host.address))
    return folder
