"""The files of the test KVM host: libvirt's configuration (a copy of the host's /etc/libvirt, edited), sshd's
configuration, the client key, the host key and the known_hosts line the service verifies it with."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.kvm.namespace import NS_IP

SSH_PORT = 2222
SSH_USER = "root"
NETWORK = "default"
POOL = "default"
NETWORK_XML = f"""<network>
  <name>{NETWORK}</name>
  <bridge name='virbr0'/>
  <forward mode='nat'/>
  <ip address='192.168.122.1' netmask='255.255.255.0'>
    <dhcp><range start='192.168.122.2' end='192.168.122.254'/></dhcp>
  </ip>
</network>"""
# QEMU as root without cgroups, private /dev or a security driver: the test host runs in a namespace of a
# machine without systemd; the images it boots live in the test's work folder.
QEMU_CONF = """user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
"""
LIBVIRTD_CONF = """unix_sock_rw_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:file:/var/log/libvirt/libvirtd.log"
"""
VIRTLOGD_CONF = 'log_outputs = "3:file:/var/log/libvirt/virtlogd.log"\n'


@dataclass(frozen=True)
class HostFiles:
    workdir: Path
    etc_libvirt: Path
    pool_dir: Path
    key: Path  # the client's private key (the service's id_ed25519)
    known_hosts: Path  # `[NS_IP]:SSH_PORT` with the host key: what the service verifies against
    host_key: Path
    sshd_config: Path
    logs: Path

    @property
    def public_key(self) -> Path:
        return self.key.with_suffix(".pub")


def write_host_files(workdir: Path) -> HostFiles:
    ssh = workdir / "ssh"
    ssh.mkdir(mode=0o700)
    files = HostFiles(
        workdir=workdir, etc_libvirt=workdir / "etc-libvirt", pool_dir=workdir / "pool",
        key=ssh / "id_ed25519", known_hosts=ssh / "known_hosts", host_key=ssh / "ssh_host_ed25519_key",
        sshd_config=ssh / "sshd_config", logs=workdir / "logs",
    )  # fmt: skip
    files.pool_dir.mkdir()
    files.logs.mkdir()
    _libvirt_config(files.etc_libvirt)
    for key, comment in ((files.key, "proxy-operator-kvm-test"), (files.host_key, "kvm-test-host")):
        keygen(key, comment=comment)
    (ssh / "authorized_keys").write_text(files.public_key.read_text())
    files.known_hosts.write_text(known_hosts_line(files.host_key.with_suffix(".pub")))
    files.sshd_config.write_text(sshd_config(files))
    return files


def _libvirt_config(target: Path) -> None:
    shutil.copytree("/etc/libvirt", target, symlinks=True)
    with (target / "qemu.conf").open("a") as conf:
        conf.write("\n# proxy-operator's test KVM host (tests/kvm/host_config.py)\n" + QEMU_CONF)
    with (target / "libvirtd.conf").open("a") as conf:
        conf.write("\n# proxy-operator's test KVM host\n" + LIBVIRTD_CONF)
    with (target / "virtlogd.conf").open("a") as conf:
        conf.write("\n" + VIRTLOGD_CONF)
    for defined in [*target.glob("qemu/networks/**/*.xml"), *target.glob("storage/**/*.xml")]:
        defined.unlink()  # the fixture defines and starts its own network and pool


def keygen(path: Path, *, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True, capture_output=True,
    )  # fmt: skip


def known_hosts_line(public_key: Path, *, host: str = NS_IP, port: int = SSH_PORT) -> str:
    kind, blob, *_ = public_key.read_text().split()
    return f"[{host}]:{port} {kind} {blob}\n"


def sshd_config(files: HostFiles) -> str:
    """Key-only root login on NS_IP:SSH_PORT; sessions run in the namespace, where libvirtd's socket is."""
    return f"""Port {SSH_PORT}
ListenAddress {NS_IP}
HostKey {files.host_key}
PidFile {files.workdir / "sshd.pid"}
AuthorizedKeysFile {files.key.parent / "authorized_keys"}
AllowUsers {SSH_USER}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
PrintLastLog no
UseDNS no
LogLevel VERBOSE
"""


def pool_xml(path: Path) -> str:
    return f"<pool type='dir'><name>{POOL}</name><target><path>{path}</path></target></pool>"
