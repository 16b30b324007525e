"""The test KVM host's place on the machine: a network and mount namespace of its own, a veth, an nft table.

`KvmNamespace.create()` starts a holder process (`unshare --net --mount`) whose namespaces libvirtd, virtlogd
and sshd join (`nsenter -t HOLDER -n -m`). In its mount namespace: a tmpfs over /run (libvirt's sockets,
sshd's privilege separation folder) and folders of the work directory bind-mounted over /etc/libvirt (a copy
of the host's, edited), /var/lib/libvirt, /var/log/libvirt and /var/cache/libvirt: the host's files are never
written. Its only link out is a veth whose host end holds HOST_IP and namespace end NS_IP; the namespace has
no default route, so libvirt's NAT network (192.168.122.0/24, inside) reaches the host's veth address and
nothing else. On the host an nft table of ours drops any forwarding from or to the veth and any input from it
not addressed to HOST_IP.

`close()` kills, by pid, every process left in the namespace (dnsmasq, QEMU, sshd's sessions), then the
holder; the veth goes with the namespace, the nft table is deleted. A session killed before close() leaves a
record that the next one clears (`clear_stale`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.kube.apiserver import die_with_parent
from tests.kube.node_host import HOST_DIR, HostSetupFailed, is_zombie, sh

HOST_LINK, NS_LINK = "pokh0", "pokn0"
HOST_IP, NS_IP, PREFIX = "10.246.0.1", "10.246.0.2", 30
NFT_TABLE = "pon_kvm_containment"
LIBVIRT_FOLDERS = ("/var/lib/libvirt", "/var/log/libvirt", "/var/cache/libvirt")
RECORD = HOST_DIR / "kvm-host.record.json"
LOCK = HOST_DIR / "kvm-host.lock"


@dataclass
class KvmNamespace:
    """The holder process and what `close()` must undo."""

    workdir: Path
    holder: subprocess.Popen[bytes] | None = None
    netns: str = ""  # the namespace's identity, `net:[inode]`
    undo: list[tuple[str, ...]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        assert self.holder is not None
        return self.holder.pid

    def enter(self) -> list[str]:
        """The argv prefix that runs a program inside the host's namespaces."""
        return ["nsenter", "-t", str(self.pid), "-n", "-m", "--"]

    def inside(self, *argv: str, stdin: str | None = None) -> str:
        return sh(*self.enter(), *argv, stdin=stdin)

    def path(self, inside: str) -> Path:
        """A path of the namespace's mount namespace, as the host reaches it (its sockets too)."""
        return Path(f"/proc/{self.pid}/root") / inside.lstrip("/")

    def create(self, *, etc_libvirt: Path) -> KvmNamespace:
        self.holder = subprocess.Popen(
            ["unshare", "--net", "--mount", "--propagation", "private", "sleep", "infinity"],
            stdin=subprocess.DEVNULL, preexec_fn=die_with_parent,
        )  # fmt: skip
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{self.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            if time.monotonic() > deadline or self.holder.poll() is not None:
                raise HostSetupFailed("unshare --net --mount did not make a namespace")
            time.sleep(0.01)
        self.netns = os.readlink(f"/proc/{self.pid}/ns/net")
        self._record()
        self._mounts(etc_libvirt)
        self._network()
        sh("nft", "-f", "-", stdin=containment_rules())
        self.undo.append(("nft", "delete", "table", "inet", NFT_TABLE))
        return self

    def _record(self) -> None:
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        RECORD.write_text(json.dumps({"workdir": str(self.workdir), "netns": self.netns}))

    def _mounts(self, etc_libvirt: Path) -> None:
        self.inside("mount", "-t", "tmpfs", "-o", "mode=755", "pon-kvm", "/run")
        self.inside("mount", "--bind", str(etc_libvirt), "/etc/libvirt")
        for folder in LIBVIRT_FOLDERS:
            mine = self.workdir / folder.strip("/").replace("/", "-")
            mine.mkdir(exist_ok=True)
            self.inside("mount", "--bind", str(mine), folder)

    def _network(self) -> None:
        sh("ip", "link", "add", HOST_LINK, "type", "veth", "peer", "name", NS_LINK, "netns", str(self.pid))
        # (gone with the namespace, maybe a moment later; deleted here if still there)
        self.undo.append(
            ("sh", "-c", f"ip link del {HOST_LINK} 2>/dev/null; ! [ -e /sys/class/net/{HOST_LINK} ]")
        )
        sh("sysctl", "-qw", f"net.ipv6.conf.{HOST_LINK}.disable_ipv6=1")
        sh("ip", "addr", "add", f"{HOST_IP}/{PREFIX}", "dev", HOST_LINK)
        sh("ip", "link", "set", HOST_LINK, "up")
        self.inside("ip", "link", "set", "lo", "up")
        self.inside("sysctl", "-qw", f"net.ipv6.conf.{NS_LINK}.disable_ipv6=1")
        self.inside("ip", "addr", "add", f"{NS_IP}/{PREFIX}", "dev", NS_LINK)
        self.inside("ip", "link", "set", NS_LINK, "up")

    def close(self) -> list[str]:
        """Undo everything; return what could not be undone (empty when the host is as it was)."""
        problems: list[str] = []
        if self.holder is not None:
            kill_namespace(self.netns, keep=self.pid)
            self.holder.kill()
            self.holder.wait(timeout=10)
        for argv in reversed(self.undo):
            try:
                sh(*argv)
            except HostSetupFailed as exc:
                problems.append(str(exc))
        self.undo.clear()
        problems += leftovers(self.netns)
        if not problems:
            RECORD.unlink(missing_ok=True)
        return problems


def leftovers(netns: str) -> list[str]:
    """What of the test KVM host is still on the machine (nothing, once it is closed)."""
    found = [f"process {pid} in its namespace" for pid in namespace_pids(netns)] if netns else []
    if Path(f"/sys/class/net/{HOST_LINK}").exists():
        found.append(f"the link {HOST_LINK}")
    table = subprocess.run(["nft", "list", "table", "inet", NFT_TABLE], check=False, capture_output=True)
    if table.returncode == 0:
        found.append(f"the nft table {NFT_TABLE}")
    return found


def containment_rules() -> str:
    return f"""table inet {NFT_TABLE} {{
    chain forward {{
        type filter hook forward priority -10; policy accept;
        iifname "{HOST_LINK}" counter drop
        oifname "{HOST_LINK}" counter drop
    }}
    chain input {{
        type filter hook input priority -10; policy accept;
        iifname "{HOST_LINK}" ip daddr != {HOST_IP} counter drop
        iifname "{HOST_LINK}" meta nfproto ipv6 counter drop
    }}
}}
"""


def namespace_pids(netns: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if os.readlink(entry / "ns" / "net") == netns and not is_zombie(entry):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def kill_namespace(netns: str, *, keep: int = 0) -> list[int]:
    """SIGKILL, by pid, every process in the network namespace `netns` but `keep`; the pids killed."""
    killed: set[int] = set()
    for _ in range(50):
        pids = [pid for pid in namespace_pids(netns) if pid != keep]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    return sorted(killed)


def clear_stale() -> list[str]:
    """Undo what a killed session's KVM host left: its processes (by the namespace they are in), the veth
    and the nft table. Call it holding LOCK. Returns what it did."""
    if not RECORD.exists():
        return []
    state, done = json.loads(RECORD.read_text()), []
    if killed := kill_namespace(state["netns"]):
        done.append(f"killed leftover processes {killed}")
    if Path(f"/sys/class/net/{HOST_LINK}").exists():
        subprocess.run(["ip", "link", "del", HOST_LINK], check=False, capture_output=True)
        done.append(f"removed link {HOST_LINK}")
    deleted = subprocess.run(["nft", "delete", "table", "inet", NFT_TABLE], check=False, capture_output=True)
    if deleted.returncode == 0:
        done.append(f"removed nft table {NFT_TABLE}")
    RECORD.unlink()
    return done
