"""Guests on the test KVM host through libvirt-python, as the kvm program will make them: a base volume
uploaded once, a copy-on-write volume on it, a NoCloud cidata ISO, a domain of type `qemu` (TCG) on the
`default` network; then its DHCP lease and its proxy port, with deadlines and the reason when it stalls."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.kvm.host import KvmHost

GIB = 1024**3
PROBE = """import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
s.sendall(b"GET http://" + sys.argv[1].encode() + b":1/ HTTP/1.0\\r\\n\\r\\n")
print(s.recv(200).decode(errors="replace").splitlines()[0])
"""


class GuestStalled(RuntimeError):
    """The guest did not reach a step in time, or cannot run (paused); the message says which."""


def upload(conn: Any, pool: Any, *, name: str, path: Path, fmt: str) -> Any:
    """A volume holding the file's bytes (a qcow2 keeps its virtual size)."""
    size = path.stat().st_size
    capacity = virtual_size(path) if fmt == "qcow2" else size
    xml = (
        f"<volume><name>{name}</name><capacity>{capacity}</capacity>"
        f"<target><format type='{fmt}'/></target></volume>"
    )
    volume = pool.createXML(xml, 0)
    stream = conn.newStream(0)
    volume.upload(stream, 0, size, 0)
    with path.open("rb") as source:
        stream.sendAll(lambda _stream, nbytes, handle: handle.read(nbytes), source)
    stream.finish()
    return volume


def virtual_size(path: Path) -> int:
    info = subprocess.run(["qemu-img", "info", "--output=json", str(path)], capture_output=True, check=True)
    return int(json.loads(info.stdout)["virtual-size"])


def cow_volume(pool: Any, *, name: str, base: Any, gib: int = 2) -> Any:
    xml = f"""<volume><name>{name}</name><capacity>{gib * GIB}</capacity>
  <target><format type='qcow2'/></target>
  <backingStore><path>{base.path()}</path><format type='qcow2'/></backingStore>
</volume>"""
    return pool.createXML(xml, 0)


def cidata_iso(conn: Any, pool: Any, *, name: str, user_data: str, meta_data: str) -> Any:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "user-data").write_text(user_data)
        (root / "meta-data").write_text(meta_data)
        iso = root / "cidata.iso"
        subprocess.run(
            ["genisoimage", "-quiet", "-output", str(iso), "-volid", "cidata", "-joliet", "-rock",
             str(root / "user-data"), str(root / "meta-data")],
            check=True, capture_output=True,
        )  # fmt: skip
        return upload(conn, pool, name=name, path=iso, fmt="raw")


def domain_xml(
    *, name: str, disk: Any, iso: Any, network: str, memory_mib: int = 512, tb_cache_mib: int | None = None
) -> str:
    """A TCG domain (type `qemu`); tb_cache_mib bounds QEMU's translation cache (its RSS) when given."""
    tcg = f"<tcg><tb-cache unit='MiB'>{tb_cache_mib}</tb-cache></tcg>" if tb_cache_mib else ""
    return f"""<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>{memory_mib}</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
  <features><acpi/><apic/>{tcg}</features>
  <on_poweroff>destroy</on_poweroff>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/><source file='{disk.path()}'/><target dev='vda' bus='virtio'/>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/><source file='{iso.path()}'/><target dev='hdc' bus='ide'/><readonly/>
    </disk>
    <interface type='network'><source network='{network}'/><model type='virtio'/></interface>
    <serial type='file'><source path='/var/log/libvirt/qemu/{name}-serial.log'/><target port='0'/></serial>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>
  </devices>
</domain>"""


def serial_log(host: KvmHost, name: str) -> Path:
    return host.files.workdir / "var-log-libvirt" / "qemu" / f"{name}-serial.log"


def check_running(libvirt: Any, domain: Any, host: KvmHost) -> None:
    state, reason = domain.state()
    if state == libvirt.VIR_DOMAIN_PAUSED:
        raise GuestStalled(
            f"the domain {domain.name()} is paused (reason {reason}): the host cannot run it; "
            "see its QEMU log under /var/log/libvirt/qemu"
        )
    if state != libvirt.VIR_DOMAIN_RUNNING:
        tail = serial_log(host, domain.name()).read_text(errors="replace")[-1500:]
        raise GuestStalled(f"the domain {domain.name()} is not running (state {state}); console:\n{tail}")


def wait_for_lease(libvirt: Any, domain: Any, host: KvmHost, *, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check_running(libvirt, domain, host)
        found = domain.interfaceAddresses(libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE, 0)
        for interface in found.values():
            for address in interface.get("addrs") or []:
                if address["type"] == libvirt.VIR_IP_ADDR_TYPE_IPV4:
                    return str(address["addr"])
        time.sleep(1)
    raise GuestStalled(f"{domain.name()} got no DHCP lease within {timeout:.0f} s")


def wait_for_agent(libvirt: Any, domain: Any, host: KvmHost, *, timeout: float) -> str:
    """The guest agent's answer to `guest-ping` through libvirt (the channel the credentials take)."""
    import libvirt_qemu

    deadline = time.monotonic() + timeout
    while True:
        check_running(libvirt, domain, host)
        try:
            return str(libvirt_qemu.qemuAgentCommand(domain, '{"execute":"guest-ping"}', 5, 0))
        except libvirt.libvirtError as exc:
            if time.monotonic() > deadline:
                raise GuestStalled(f"the guest agent of {domain.name()} does not answer: {exc}") from exc
        time.sleep(1)


def proxy_status_line(host: KvmHost, address: str, port: int) -> str | None:
    """The first line the proxy answers to a request sent from inside the host's namespace, or None."""
    try:
        return host.inside(sys.executable, "-c", PROBE, address, str(port)).strip() or None
    except Exception:
        return None


def wait_for_proxy(
    libvirt: Any, domain: Any, host: KvmHost, *, address: str, port: int, timeout: float
) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check_running(libvirt, domain, host)
        if line := proxy_status_line(host, address, port):
            return line
        time.sleep(2)
    tail = serial_log(host, domain.name()).read_text(errors="replace")[-2000:]
    raise GuestStalled(f"nothing answered on {address}:{port} within {timeout:.0f} s; console:\n{tail}")
