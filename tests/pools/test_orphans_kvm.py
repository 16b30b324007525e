"""kvm orphans: the host-side scripts run in a local `sh` against a fake `virsh` (no KVM host or SSH server
here, as in tests/security/test_kvm_credentials.py); the runner stands in for `ssh` and keeps its argv."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from automation.orphans.kvm import DOMAIN_TYPES, KvmHosts, delete_kvm, kvm_orphans
from stacks.models import KvmProvider

# Three domains: ours (this installation), ours of another installation, and one of someone else.
FAKE_VIRSH = r"""#!/bin/sh
echo "ARGV $*" >> "$(dirname "$0")/calls"
case "$*" in
  *" list --all --name"*) printf 'px-crawl-a\npx-crawl-b\npx-other\nwebserver\n\n' ;;
  *"domuuid px-crawl-a"*) echo "uuid-a" ;;
  *"domuuid px-crawl-b"*) echo "uuid-b" ;;
  *"domuuid px-other"*) echo "uuid-o" ;;
  *"domuuid webserver"*) echo "uuid-w" ;;
  *"desc px-crawl-a"*) echo "managed-by=proxy-operator proxy=crawl/a stack=kvm-home installation=install-1" ;;
  *"desc px-crawl-b"*) echo "managed-by=proxy-operator proxy=crawl/b stack=kvm-home installation=install-1" ;;
  *"desc px-other"*) echo "managed-by=proxy-operator proxy=crawl/o stack=kvm-home installation=install-2" ;;
  *"desc webserver"*) echo "No description for domain: webserver" ;;
esac
exit 0
"""
ENTRY = KvmProvider.model_validate(
    {
        "name": "kvm-home",
        "type": "kvm",
        "hosts": [{"name": "hv1", "uri": "qemu+ssh://virt@hv1.lan:2222/system"}],
    }
)


class LocalShell:
    def __init__(self) -> None:
        self.argv: list[str] = []

    def __call__(self, argv: Sequence[str], script: str) -> subprocess.CompletedProcess[str]:
        self.argv = list(argv)
        return subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, timeout=60)


@pytest.fixture
def fake_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    virsh = tmp_path / "virsh"
    virsh.write_text(FAKE_VIRSH)
    virsh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    return tmp_path


def test_lists_this_installations_domains_that_no_state_holds_and_deletes_one(fake_host: Path) -> None:
    shell = LocalShell()
    hosts = KvmHosts(ENTRY, "/etc/proxy-operator/kvm", runner=shell)
    domains = hosts.domains()
    assert [d.name for d in domains] == ["px-crawl-a", "px-crawl-b", "px-other", "webserver"]
    assert shell.argv[-3:] == ["virt@hv1.lan", "sh", "-s"]

    for kind in DOMAIN_TYPES:  # the kvm program's domains, and pulumi-libvirt's in stacks made before
        [orphan] = kvm_orphans(
            domains, provider="kvm-home", installation="install-1", known={(kind, "uuid-b")}
        )
    assert (orphan.kind, orphan.id, orphan.name, orphan.location) == ("domain", "uuid-a", "px-crawl-a", "hv1")
    assert shell.argv[shell.argv.index("-p") + 1] == "2222"
    assert "UserKnownHostsFile=/etc/proxy-operator/kvm/known_hosts" in shell.argv
    assert "virt@hv1.lan" in shell.argv

    assert delete_kvm(hosts, orphan)
    calls = (fake_host / "calls").read_text().splitlines()
    assert calls[-2:] == [
        "ARGV -q -c qemu:///system destroy uuid-a",
        "ARGV -q -c qemu:///system undefine uuid-a --remove-all-storage",
    ]


def test_a_failing_host_is_an_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    virsh = tmp_path / "virsh"
    virsh.write_text("#!/bin/sh\necho 'error: failed to connect to the hypervisor' >&2\nexit 1\n")
    virsh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with pytest.raises(RuntimeError, match=r"host hv1 of kvm-home.*failed to connect"):
        KvmHosts(ENTRY, "/etc/proxy-operator/kvm", runner=LocalShell()).domains()
