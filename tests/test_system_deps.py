"""scripts/install-system-deps.sh, run with a PATH of stand-in programs: what it installs, and what it says
when it cannot. (The real apt-get ran on CI's fresh machines: `.ci/run` installs nothing itself.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "install-system-deps.sh"
TEST_PROGRAMS = {
    "redis-server",
    "pgrep",
    "ssh-keygen",
    "openssl",
    "nft",
    "ip",
    "unshare",
    "setpriv",
    "chromium",
    "chromedriver",
    "containerd",
    "runc",
    "bridge",  # a CNI plugin, looked for in PROXY_OPERATOR_CNI_DIR (the stand-ins' folder here)
    "conntrack",
    "ipset",
    "iptables",
    "gcc",
    "mmdebstrap",
    "podman",
    "newuidmap",
    # the test KVM host (tests/kvm/host.py) and make kvm-image
    "libvirtd",
    "virsh",
    "qemu-system-x86_64",
    "qemu-img",
    "dnsmasq",
    "sshd",
    "genisoimage",
    "extlinux",
    "sfdisk",
    "pkg-config",  # a stand-in exiting 0: `pkg-config --exists libvirt` says libvirt-dev is there
    "mbr.bin",  # syslinux's MBR, looked for in PROXY_OPERATOR_SYSLINUX_DIR/mbr (the stand-ins' folder here)
}
KVM_PACKAGES = (
    "extlinux fdisk genisoimage libvirt-clients libvirt-daemon-system libvirt-dev openssh-server pkg-config"
    " qemu-system-x86 qemu-utils syslinux-common"
)


def _stub(folder: Path, name: str, body: str = "exit 0") -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _machine(tmp_path: Path, *, present: set[str], uid: int = 0) -> tuple[Path, dict[str, str]]:
    """A bin folder with the given programs, apt-get recording its calls, `id -u` printing uid."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sort", "cat", "sh", "chmod", "rm"):  # what the script itself calls besides bash builtins
        os.symlink(shutil.which(tool) or f"/usr/bin/{tool}", bin_dir / tool)
    for name in present | {"python3.11"}:
        _stub(bin_dir, name)
    if "mbr.bin" in present:
        (bin_dir / "mbr").mkdir()
        (bin_dir / "mbr.bin").rename(bin_dir / "mbr" / "mbr.bin")
    log = tmp_path / "apt.log"
    _stub(bin_dir, "apt-get", f'echo "$*" >> {log}')
    _stub(bin_dir, "id", f"echo {uid}")
    folders = {"PROXY_OPERATOR_CNI_DIR": str(bin_dir), "PROXY_OPERATOR_SYSLINUX_DIR": str(bin_dir)}
    return log, {"PATH": str(bin_dir), "HOME": str(tmp_path), **folders}


def _run(env: dict[str, str], group: str) -> subprocess.CompletedProcess[str]:
    bash = shutil.which("bash") or "/bin/bash"
    return subprocess.run([bash, str(SCRIPT), group], env=env, capture_output=True, text=True, timeout=60)


def test_nothing_missing_does_nothing(tmp_path: Path) -> None:
    log, env = _machine(tmp_path, present=TEST_PROGRAMS)
    result = _run(env, "test")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert not log.exists()


def test_missing_test_programs_are_installed_as_root(tmp_path: Path) -> None:
    log, env = _machine(tmp_path, present=TEST_PROGRAMS - {"redis-server", "ssh-keygen"})
    result = _run(env, "test")
    assert result.returncode == 0, result.stderr
    assert "missing redis-server (Debian package redis-server)" in result.stdout
    assert "missing ssh-keygen (Debian package openssh-client)" in result.stdout
    calls = log.read_text().splitlines()
    assert calls[0] == "update -qq"
    assert calls[1] == "install -y -qq --no-install-recommends openssh-client redis-server"


def test_base_does_not_install_what_only_tests_need(tmp_path: Path) -> None:
    log, env = _machine(tmp_path, present=set())
    assert _run(env, "base").returncode == 0
    assert not log.exists()


def test_without_root_it_names_the_packages_and_the_command(tmp_path: Path) -> None:
    log, env = _machine(tmp_path, present=TEST_PROGRAMS - {"redis-server"}, uid=1000)
    result = _run(env, "test")
    assert result.returncode == 1
    assert "missing redis-server (Debian package redis-server)" in result.stdout
    assert "sudo apt-get install -y redis-server" in result.stderr
    assert not log.exists()


def test_the_browser_and_its_driver_come_from_debian(tmp_path: Path) -> None:
    log, env = _machine(tmp_path, present=TEST_PROGRAMS - {"chromium", "chromedriver"})
    result = _run(env, "test")
    assert result.returncode == 0, result.stderr
    assert "missing chromedriver (Debian package chromium-driver)" in result.stdout
    assert (
        log.read_text().splitlines()[1] == "install -y -qq --no-install-recommends chromium chromium-driver"
    )


def test_the_test_nodes_runtime_and_network_come_from_debian(tmp_path: Path) -> None:
    node = {"containerd", "runc", "bridge", "conntrack", "ipset", "iptables"}
    log, env = _machine(tmp_path, present=TEST_PROGRAMS - node)
    result = _run(env, "test")
    assert result.returncode == 0, result.stderr
    assert "(Debian package containernetworking-plugins): the test node's pod network" in result.stdout
    packages = "conntrack containerd containernetworking-plugins ipset iptables runc"
    assert log.read_text().splitlines()[1] == f"install -y -qq --no-install-recommends {packages}"


def test_the_test_kvm_host_and_its_image_tools_come_from_debian_with_no_daemon_started(
    tmp_path: Path,
) -> None:
    kvm = {"libvirtd", "virsh", "qemu-system-x86_64", "qemu-img", "dnsmasq", "sshd", "genisoimage",
           "extlinux", "sfdisk", "pkg-config", "mbr.bin"}  # fmt: skip
    log, policy, env = _bench_machine(tmp_path, present=TEST_PROGRAMS - kvm)
    result = _run(env, "test")
    assert result.returncode == 0, result.stderr
    assert "missing libvirtd (Debian package libvirt-daemon-system): tests/kvm/host.py" in result.stdout
    assert "missing libvirt.pc (Debian package libvirt-dev)" in result.stdout
    assert "mbr/mbr.bin (Debian package syslinux-common)" in result.stdout
    calls = log.read_text().splitlines()
    assert calls[2] == f"install -y -qq --no-install-recommends dnsmasq-base {KVM_PACKAGES}"
    assert calls[3] == "policy 101"  # libvirtd, virtlogd and sshd are started by the tests, never by apt
    assert not policy.exists()


def test_the_kvm_group_alone_installs_the_kvm_host_with_no_daemon_started(tmp_path: Path) -> None:
    log, policy, env = _bench_machine(tmp_path, present={"mmdebstrap", "dnsmasq"})
    result = _run(env, "kvm")
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    assert calls[2:4] == [f"install -y -qq --no-install-recommends {KVM_PACKAGES}", "policy 101"]
    assert not policy.exists()


def test_libvirt_dev_is_installed_when_pkg_config_does_not_find_libvirt(tmp_path: Path) -> None:
    log, env = _machine(tmp_path, present=TEST_PROGRAMS - {"pkg-config"})
    _stub(tmp_path / "bin", "pkg-config", '[ "$*" != "--exists libvirt" ]')
    result = _run(env, "test")
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines()[1] == "install -y -qq --no-install-recommends libvirt-dev"


def _bench_machine(
    tmp_path: Path, *, present: frozenset[str] | set[str] = frozenset()
) -> tuple[Path, Path, dict[str, str]]:
    """As _machine (nothing present by default), apt-get also noting what the policy-rc.d answers while it
    runs."""
    log, env = _machine(tmp_path, present=set(present))
    policy = tmp_path / "policy-rc.d"
    answer = f'[ -x {policy} ] && {policy}; echo "policy $?" >> {log}'
    _stub(tmp_path / "bin", "apt-get", f'echo "$*" >> {log}; {answer}')
    return log, policy, env | {"PROXY_OPERATOR_POLICY_RC_D": str(policy)}


def test_the_bench_daemons_come_from_debian_and_none_is_started(tmp_path: Path) -> None:
    log, policy, env = _bench_machine(tmp_path)
    result = _run(env, "bench")
    assert result.returncode == 0, result.stderr
    assert "missing danted (Debian package dante-server)" in result.stdout
    calls = log.read_text().splitlines()
    assert calls[2] == "install -y -qq --no-install-recommends dante-server tinyproxy wrk"
    assert calls[3] == "policy 101"  # every service start refused while the packages install
    assert not policy.exists()  # and the policy gone after


def test_a_policy_rc_d_already_there_is_left_alone(tmp_path: Path) -> None:
    _, policy, env = _bench_machine(tmp_path)
    policy.write_text("#!/bin/sh\nexit 101\n# the container's own\n")
    policy.chmod(0o755)
    assert _run(env, "bench").returncode == 0
    assert policy.read_text().endswith("# the container's own\n")


def test_the_test_set_installs_no_bench_daemon(tmp_path: Path) -> None:
    log, _, env = _bench_machine(tmp_path)
    _run(env, "test")
    assert "tinyproxy" not in log.read_text()
