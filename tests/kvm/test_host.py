"""The test KVM host end to end, the way the kvm program will use it: libvirt-python over the
qemu+libssh URI (key, known_hosts, verification on) uploads a guest image as a base volume, makes a
copy-on-write volume on it and a NoCloud cidata ISO, defines and starts a TCG domain, which gets a DHCP lease
from the default network and runs the project's own proxy setup (cloud-init user-data), so tinyproxy answers
on the configured port inside the namespace. Removing it leaves the base volume. A known_hosts that does
not hold the host's key is refused before anything is done."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stacks.programs.proxy_config import ProxySettings, cloud_init_meta_data, cloud_init_user_data
from tests.kvm.guests import (
    cidata_iso,
    cow_volume,
    domain_xml,
    upload,
    wait_for_agent,
    wait_for_lease,
    wait_for_proxy,
)
from tests.kvm.host import KvmHost
from tests.kvm.host_config import keygen, known_hosts_line
from tests.kvm.images import GuestImage

PROXY_PORT = 3128
TB_CACHE_MIB = 128  # QEMU's translation cache: its default makes a guest's RSS grow past 800 MiB
LEASE_TIMEOUT = {"fast": 120.0, "full": 240.0}
PROXY_TIMEOUT = {"fast": 180.0, "full": 420.0}


def _user_data(hostname: str) -> str:
    settings = ProxySettings(
        port=PROXY_PORT, protocol="http", allowed_source_ranges=("192.168.122.0/24",), credentials=None
    )
    return cloud_init_user_data(settings, hostname=hostname)


def _boot_and_remove(
    libvirt: Any, host: KvmHost, image: GuestImage, say: Callable[[str], None]
) -> dict[str, float]:
    conn = libvirt.open(host.uri())
    try:
        pool = conn.storagePoolLookupByName(host.pool)
        started = time.monotonic()
        base = upload(
            conn,
            pool,
            name=f"base-{image.variant}-{secrets.token_hex(3)}.qcow2",
            path=image.path,
            fmt="qcow2",
        )
        times = {"upload": time.monotonic() - started}
        name = f"px-smoke-{image.variant}-{secrets.token_hex(3)}"
        disk = cow_volume(pool, name=f"{name}.qcow2", base=base)
        meta = cloud_init_meta_data(instance_id=name, hostname=name)
        iso = cidata_iso(conn, pool, name=f"{name}-cidata.iso", user_data=_user_data(name), meta_data=meta)
        xml = domain_xml(name=name, disk=disk, iso=iso, network=host.network, tb_cache_mib=TB_CACHE_MIB)
        domain = conn.defineXML(xml)
        domain.create()
        booted = time.monotonic()
        address = wait_for_lease(libvirt, domain, host, timeout=LEASE_TIMEOUT[image.variant])
        times["lease"] = time.monotonic() - booted
        line = wait_for_proxy(
            libvirt, domain, host, address=address, port=PROXY_PORT, timeout=PROXY_TIMEOUT[image.variant]
        )
        times["proxy"] = time.monotonic() - booted
        assert wait_for_agent(libvirt, domain, host, timeout=30) == '{"return":{}}'
        times["qemu_rss_mib"] = qemu_rss_mib(host, name)
        say(f"{image.variant} guest {name}: lease {address} after {times['lease']:.1f} s, proxy port after "
            f"{times['proxy']:.1f} s ({line!r}); QEMU RSS {times['qemu_rss_mib']:.0f} MiB")  # fmt: skip
        assert line.startswith("HTTP/1."), line
        domain.destroy()
        domain.undefine()
        for volume in (disk, iso):
            volume.delete(0)
        pool.refresh(0)
        left = set(pool.listVolumes())
        assert base.name() in left  # the base image is kept for the next guest
        assert not {disk.name(), iso.name()} & left
        assert name not in [d.name() for d in conn.listAllDomains()]
        base.delete(0)  # this test's own base (a real host keeps it)
        return times
    finally:
        conn.close()


def qemu_rss_mib(host: KvmHost, name: str) -> float:
    pids = host.inside("pgrep", "-f", f"guest={name}").split()
    status = Path(f"/proc/{pids[0]}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def test_a_fast_guest_boots_over_libssh_and_its_proxy_answers(
    libvirt: Any, kvm_host: KvmHost, fast_image: GuestImage, say: Callable[[str], None]
) -> None:
    times = _boot_and_remove(libvirt, kvm_host, fast_image, say)
    say(f"fast image {'cached' if fast_image.reused else 'cold'} {fast_image.seconds:.1f} s; {times}")


@pytest.mark.parametrize("case", ["another key", "no entry"])
def test_a_known_hosts_without_the_hosts_key_is_refused(
    libvirt: Any, kvm_host: KvmHost, tmp_path: Path, case: str
) -> None:
    wrong = tmp_path / "known_hosts"
    if case == "another key":
        keygen(tmp_path / "other", comment="not-the-host")
        wrong.write_text(known_hosts_line(tmp_path / "other.pub"))
    else:
        wrong.write_text("")
    with pytest.raises(libvirt.libvirtError) as refused:
        libvirt.open(kvm_host.uri(known_hosts=wrong)).close()
    message = str(refused.value)
    assert "host key" in message.lower() or "SSH HOST KEY" in message, message
    libvirt.open(kvm_host.uri()).close()  # the right file still opens


def test_the_full_systemd_image_boots_the_same_way(
    libvirt: Any, kvm_host: KvmHost, full_image: GuestImage, say: Callable[[str], None]
) -> None:
    times = _boot_and_remove(libvirt, kvm_host, full_image, say)
    say(f"full image {'cached' if full_image.reused else 'cold'} {full_image.seconds:.1f} s; {times}")
