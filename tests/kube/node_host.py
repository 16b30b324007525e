"""The test node's place on the host: its own network and mount namespace, one veth, and what is restored.

`NodeNamespace.create()` starts a holder process (`unshare --net --mount`) whose namespaces every node program
joins (`nsenter -t HOLDER -n -m`). Inside: tmpfs over /run, /var/lib and /var/log (containerd's shim sockets,
libcni's cache, kubelet's hard-coded folders stay in the namespace), files bind-mounted over the host-wide
sysctls the kubelet writes, and `ip_forward` on (a per-namespace sysctl). The only way out is the veth to the
host, and the node has NO default route: pods can reach the host's veth address (test servers) and nothing
else. On the host an nft table of ours drops any forwarding from or to the veth and any input from it not
addressed to the veth's own address, so even a route added by mistake cannot carry pod traffic outside.

`close()` kills, by pid, every process left in the node's network namespace or in its pod cgroups (containerd
shims, containers), removes the cgroups kubelet made, the veth and the nft table, and puts back every
host sysctl it watched that changed.
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
from tests.kube.node_config import CGROUP_PARENT, HOST_IP, NODE_IP, POD_CIDR, SERVICE_CIDR, VETH_PREFIX

HOST_LINK, NODE_LINK = "ponh0", "ponn0"
NFT_TABLE = "pon_node_containment"
CGROUPS = Path("/sys/fs/cgroup")
# Host-wide sysctls the kubelet sets unless kept from it (bind-mounted inside the namespace)
KUBELET_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")  # fmt: skip
WATCHED_SYSCTLS = (*KUBELET_SYSCTLS, "net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables",
                   "net/netfilter/nf_conntrack_max", "net/ipv4/conf/all/route_localnet")  # fmt: skip
PRIVATE_MOUNTS = ("/run", "/var/lib", "/var/log")
# The node's links, addresses, nft table and sysctls belong to the host, not to a clone or a build cache:
# its lock and the record of the host's state before it live in one host-wide folder, so two sessions
# with different PROXY_OPERATOR_CACHE_DIRs (a cold CI run beside a warm one) still take turns.
HOST_DIR = Path("/run/lock/proxy-operator")
RECORD = HOST_DIR / "test-node.record.json"
LOCK = HOST_DIR / "test-node.lock"


class HostSetupFailed(RuntimeError):
    """A host command of the node's setup failed; the message has the command and its output."""


def sh(*argv: str, stdin: str | None = None) -> str:
    result = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise HostSetupFailed(
            f"`{' '.join(argv)}` failed ({result.returncode}): {result.stderr.strip()[-800:]}"
        )
    return result.stdout


def read_sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", name).read_text().strip()
    except OSError:
        return None


@dataclass
class NodeNamespace:
    """The holder process, and what `close()` must undo."""

    workdir: Path
    holder: subprocess.Popen[bytes] | None = None
    sysctls: dict[str, str | None] = field(default_factory=dict)
    undo: list[tuple[str, ...]] = field(default_factory=list)  # host commands, run last-first on close
    cgroup_dirs: list[Path] = field(default_factory=list)

    @property
    def pid(self) -> int:
        assert self.holder is not None
        return self.holder.pid

    def enter(self) -> list[str]:
        """The argv prefix that runs a program inside the node's namespaces."""
        return ["nsenter", "-t", str(self.pid), "-n", "-m", "--"]

    def inside(self, *argv: str) -> str:
        return sh(*self.enter(), *argv)

    def create(self) -> NodeNamespace:
        self.sysctls = {name: read_sysctl(name) for name in WATCHED_SYSCTLS}
        self.holder = subprocess.Popen(
            ["unshare", "--net", "--mount", "--propagation", "private", "sleep", "infinity"],
            stdin=subprocess.DEVNULL, preexec_fn=die_with_parent,
        )  # fmt: skip
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{self.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            if time.monotonic() > deadline or self.holder.poll() is not None:
                raise HostSetupFailed("unshare --net --mount did not make a namespace")
            time.sleep(0.01)
        self._record()
        self._mounts()
        self._network()
        self._containment()
        self._cgroups()
        self._record()
        return self

    def _record(self) -> None:
        """What a later session needs to clean up if this one is killed before close() (clear_stale)."""
        state = {"workdir": str(self.workdir), "holder": self.pid, "sysctls": self.sysctls,
                 "cgroups": [str(p) for p in self.cgroup_dirs]}  # fmt: skip
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        RECORD.write_text(json.dumps(state))

    def _mounts(self) -> None:
        for path in PRIVATE_MOUNTS:
            self.inside("mount", "-t", "tmpfs", "-o", "mode=755", "pon-node", path)
        kept = self.workdir / "kept-sysctls"
        kept.mkdir(exist_ok=True)
        for name in KUBELET_SYSCTLS:
            copy = kept / name.replace("/", ".")
            copy.write_text(f"{read_sysctl(name)}\n")
            self.inside("mount", "--bind", str(copy), f"/proc/sys/{name}")

    def _network(self) -> None:
        sh("ip", "link", "add", HOST_LINK, "type", "veth", "peer", "name", NODE_LINK, "netns", str(self.pid))
        # (gone by itself when the namespace dies; undone only if still there, and only once we made it)
        self.undo.append(("sh", "-c", f"! [ -e /sys/class/net/{HOST_LINK} ] || ip link del {HOST_LINK}"))
        sh("sysctl", "-qw", f"net.ipv6.conf.{HOST_LINK}.disable_ipv6=1")
        sh("ip", "addr", "add", f"{HOST_IP}/{VETH_PREFIX}", "dev", HOST_LINK)
        sh("ip", "link", "set", HOST_LINK, "up")
        for cidr in (POD_CIDR, SERVICE_CIDR):  # removed with the link
            sh("ip", "route", "add", cidr, "via", NODE_IP, "dev", HOST_LINK)
        self.inside("ip", "link", "set", "lo", "up")
        self.inside("sysctl", "-qw", f"net.ipv6.conf.{NODE_LINK}.disable_ipv6=1")
        self.inside("ip", "addr", "add", f"{NODE_IP}/{VETH_PREFIX}", "dev", NODE_LINK)
        self.inside("ip", "link", "set", NODE_LINK, "up")
        self.inside("sysctl", "-qw", "net.ipv4.ip_forward=1")  # the namespace's own, not the host's

    def _containment(self) -> None:
        sh("nft", "-f", "-", stdin=containment_rules())
        self.undo.append(("nft", "delete", "table", "inet", NFT_TABLE))

    def _cgroups(self) -> None:
        """kubelet's cgroupRoot must exist in every hierarchy; cpuset needs its cpus and mems filled."""
        for hierarchy in sorted(CGROUPS.iterdir()):
            if not hierarchy.is_dir() or (hierarchy / CGROUP_PARENT).exists():
                continue
            parent = hierarchy / CGROUP_PARENT
            parent.mkdir()
            self.cgroup_dirs.append(parent)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (parent / name).exists():
                    (parent / name).write_text((hierarchy / name).read_text())

    def close(self) -> list[str]:
        """Undo everything; return what could not be undone (empty when the host is as it was)."""
        problems: list[str] = []
        self._kill_leftovers()
        for argv in reversed(self.undo):
            try:
                sh(*argv)
            except HostSetupFailed as exc:
                problems.append(str(exc))
        self.undo.clear()
        problems += self._remove_cgroups()
        problems += self._restore_sysctls()
        if not problems:
            RECORD.unlink(missing_ok=True)
        return problems

    def _kill_leftovers(self) -> None:
        if self.holder is None:
            return
        netns = os.readlink(f"/proc/{self.pid}/ns/net") if self.holder.poll() is None else ""
        for _ in range(50):
            pids = [pid for pid in node_pids(netns) if pid != self.pid]
            if not pids:
                break
            for pid in pids:
                with _gone():
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        self.holder.kill()
        self.holder.wait(timeout=10)

    def _remove_cgroups(self) -> list[str]:
        problems = []
        for parent in self.cgroup_dirs:
            for _ in range(50):
                if remove_tree(parent):
                    break
                time.sleep(0.1)
            else:
                problems.append(f"cgroup {parent} is still there")
        return problems

    def _restore_sysctls(self) -> list[str]:
        changed = []
        for name, before in self.sysctls.items():
            now = read_sysctl(name)
            if before is not None and now != before:
                Path("/proc/sys", name).write_text(before)
                changed.append(f"{name} was {before}, found {now}: put back")
        return changed


def clear_stale() -> list[str]:
    """Undo what a killed session's node left (its record names its work folder, holder, cgroups and the
    sysctls as they were): kill by pid every process whose command line names that folder (containerd's shims
    do) or that sits in the pods' cgroups, then remove the veth, the nft table and the cgroups, and put the
    sysctls back. Call it holding the node lock (no other node is running then). Returns what it did."""
    if not RECORD.exists():
        return []
    state = json.loads(RECORD.read_text())
    done, workdir, killed = [], state["workdir"], set()
    for _ in range(50):
        pids = [pid for pid in node_pids("") if pid != os.getpid()] + named_pids(workdir)
        with _gone():
            if Path(f"/proc/{state['holder']}/cmdline").read_bytes() == b"sleep\0infinity\0":
                pids.append(state["holder"])
        if not pids:
            break
        for pid in set(pids):
            with _gone():
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(0.1)
    if killed:
        done.append(f"killed leftover processes {sorted(killed)}")
    if Path(f"/sys/class/net/{HOST_LINK}").exists():
        subprocess.run(["ip", "link", "del", HOST_LINK], check=False, capture_output=True)
        done.append(f"removed link {HOST_LINK}")
    if (
        subprocess.run(
            ["nft", "delete", "table", "inet", NFT_TABLE], check=False, capture_output=True
        ).returncode
        == 0
    ):
        done.append(f"removed nft table {NFT_TABLE}")
    for cgroup in state["cgroups"]:
        remove_tree(Path(cgroup))
    for name, before in state["sysctls"].items():
        if before is not None and read_sysctl(name) != before:
            Path("/proc/sys", name).write_text(before)
            done.append(f"put {name} back to {before}")
    RECORD.unlink()
    return done


def named_pids(text: str) -> list[int]:
    """Processes whose command line holds `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with _gone():
                if text.encode() in (entry / "cmdline").read_bytes() and not is_zombie(entry):
                    found.append(int(entry.name))
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


def node_pids(netns: str) -> list[int]:
    """Processes in the node's network namespace or in its pods' cgroups (containers have their own netns)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if is_zombie(entry):
                continue
            in_netns = bool(netns) and os.readlink(entry / "ns" / "net") == netns
            in_pods = f"/{CGROUP_PARENT}/" in (entry / "cgroup").read_text()
        except OSError:
            continue
        if in_netns or in_pods:
            found.append(int(entry.name))
    return found


def is_zombie(entry: Path) -> bool:
    """An exited process not yet reaped (it is gone for every purpose here)."""
    return (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def remove_tree(path: Path) -> bool:
    """rmdir a cgroup and its children, deepest first; False while a cgroup still has tasks."""
    if not path.exists():
        return True
    for child in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with _gone():
            child.rmdir()
    try:
        path.rmdir()
    except OSError:
        return False
    return True


class _gone:
    """Ignore a process or folder that went away meanwhile."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, (ProcessLookupError, FileNotFoundError, OSError))
