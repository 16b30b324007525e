"""KVM credentials reach the guest over SSH and the guest agent, never a command line on the host.

There is no KVM host (nor SSH server) here: the host's side of the delivery, the POSIX script that
`GuestCredentialsProvider` pipes into `ssh ... sh -s`, runs in a local `sh` against a fake `virsh` that
answers like the guest agent (QMP-style JSON with spaces) and records its arguments and stdin. The
program's libvirt inputs are checked on mocks in tests/stacks/test_program_kvm.py. Fails on the code
before: the password was in the cloud-init user-data.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from stacks.programs import kvm_credentials
from stacks.programs.boot_credentials import file_fetch
from stacks.programs.kvm_credentials import (
    RECEIVER_PATH,
    GuestCredentialsProvider,
    ssh_argv,
    ssh_destination,
)

PASSWORD = "S3cretPassw0rd"
FAKE_VIRSH = r"""#!/bin/sh
# Records argv (one line per call) and stdin; answers as qemu-guest-agent would through libvirt.
LOG="$(dirname "$0")/calls"
echo "ARGV $*" >> "$LOG"
case "$*" in
  *guest-ping*) [ -e "$(dirname "$0")/agent-down" ] && exit 1; echo '{"return": {}}'; exit 0 ;;
  *guest-exec-status*) echo "{\"return\": {\"exitcode\": ${EXITCODE:-0}, \"exited\": true}}"; exit 0 ;;
esac
# No command: virsh reads its commands from stdin. While a `no-receiver` file holds a count above 0, the
# guest has no receiver yet (cloud-init still running): the agent's error, as libvirt words it.
cat > "$(dirname "$0")/stdin"
WAIT="$(dirname "$0")/no-receiver"
if [ -e "$WAIT" ] && [ "$(cat "$WAIT")" -gt 0 ]; then
  echo $(( $(cat "$WAIT") - 1 )) > "$WAIT"
  printf '%s%s\n' "error: internal error: unable to execute QEMU agent command 'guest-exec': Guest agent " \
    "command failed, error was 'Failed to execute child process (No such file or directory)'" >&2
  exit 0  # virsh reading commands from stdin exits 0 after a failed command (seen on the test KVM host)
fi
[ -e "$(dirname "$0")/exec-refused" ] && { echo "error: guest-exec is disabled" >&2; exit 1; }
echo '{"return": {"pid": 4242}}'
"""
PROPS = {
    "sshTarget": "virt@hv1.lan",
    "sshPort": 2222,
    "sshDir": "/etc/proxy-operator/kvm",
    "libvirtUri": "qemu:///system",
    "domain": "px-crawl-a",
    "domainId": "uuid-1",
    "username": "crawler",
    "password": PASSWORD,
}


@pytest.fixture
def fake_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    virsh = tmp_path / "virsh"
    virsh.write_text(FAKE_VIRSH)
    virsh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(kvm_credentials, "POLL_SECONDS", 0)
    monkeypatch.setattr(kvm_credentials, "RECEIVER_POLL_SECONDS", 0)
    return tmp_path


class LocalShell:
    """Stands in for `ssh`: runs the script in a local `sh -s`, keeping the argv ssh would have had."""

    def __init__(self) -> None:
        self.argv: list[str] = []

    def __call__(self, argv: Sequence[str], script: str) -> subprocess.CompletedProcess[str]:
        self.argv = list(argv)
        return subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, timeout=60)


def test_the_credentials_go_on_stdin_to_the_receiver_and_never_in_an_argument(fake_host: Path) -> None:
    shell = LocalShell()
    GuestCredentialsProvider(runner=shell).create(dict(PROPS))

    argv_lines = (fake_host / "calls").read_text()
    encoded = base64.b64encode(f"crawler:{PASSWORD}".encode()).decode()
    assert PASSWORD not in argv_lines
    assert encoded not in argv_lines
    assert PASSWORD not in " ".join(shell.argv)
    assert "guest-ping" in argv_lines
    assert '"pid":4242' in argv_lines
    [command] = (fake_host / "stdin").read_text().splitlines()
    domain, payload = command.split(" ", 2)[1:]
    request = json.loads(payload.strip("'"))
    assert domain == "px-crawl-a"
    assert request["execute"] == "guest-exec"
    assert request["arguments"]["path"] == RECEIVER_PATH
    assert base64.b64decode(request["arguments"]["input-data"]).decode() == f"crawler:{PASSWORD}"


def test_a_failing_setup_in_the_guest_fails_the_delivery(
    fake_host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXITCODE", "1")
    with pytest.raises(RuntimeError, match="the proxy setup failed in the guest"):
        GuestCredentialsProvider(runner=LocalShell()).create(dict(PROPS))


def test_a_guest_without_its_receiver_yet_is_asked_again_until_cloud_init_wrote_it(fake_host: Path) -> None:
    """Seen on the test KVM host: the image's agent answers before cloud-init wrote the receiver."""
    (fake_host / "no-receiver").write_text("3")
    GuestCredentialsProvider(runner=LocalShell()).create(dict(PROPS))
    assert (fake_host / "no-receiver").read_text().strip() == "0"
    assert "guest-exec-status" in (fake_host / "calls").read_text()


def test_a_receiver_that_never_appears_fails_the_delivery_naming_it(
    fake_host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (fake_host / "no-receiver").write_text("99")
    monkeypatch.setattr(kvm_credentials, "RECEIVER_WAIT_TRIES", 3)
    with pytest.raises(RuntimeError, match=f"cloud-init never wrote {RECEIVER_PATH}"):
        GuestCredentialsProvider(runner=LocalShell()).create(dict(PROPS))


def test_another_guest_exec_refusal_fails_at_once(fake_host: Path) -> None:
    (fake_host / "exec-refused").touch()
    with pytest.raises(RuntimeError, match=r"guest-exec of the credentials receiver failed: .*disabled"):
        GuestCredentialsProvider(runner=LocalShell()).create(dict(PROPS))
    assert (fake_host / "calls").read_text().count("ARGV -q -c qemu:///system\n") <= 1


def test_a_guest_agent_that_never_answers_fails_the_delivery(
    fake_host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (fake_host / "agent-down").touch()
    monkeypatch.setattr(kvm_credentials, "AGENT_WAIT_TRIES", 2)
    with pytest.raises(RuntimeError, match="the guest agent never answered"):
        GuestCredentialsProvider(runner=LocalShell()).create(dict(PROPS))


def test_ssh_verifies_the_host_key_with_the_mounted_files_only() -> None:
    argv = ssh_argv(target="virt@hv1.lan", port=2222, ssh_dir="/etc/proxy-operator/kvm/")

    assert argv[:3] == ["ssh", "-F", "/dev/null"]
    assert argv[-3:] == ["virt@hv1.lan", "sh", "-s"]
    options = {argv[i + 1] for i, arg in enumerate(argv) if arg == "-o"}
    assert {"StrictHostKeyChecking=yes", "BatchMode=yes", "IdentitiesOnly=yes"} <= options
    assert "UserKnownHostsFile=/etc/proxy-operator/kvm/known_hosts" in options
    assert argv[3:5] == ["-i", "/etc/proxy-operator/kvm/id_ed25519"]
    assert argv[-5:-3] == ["-p", "2222"]


def test_the_hosts_own_libvirt_uri_comes_from_the_catalogue_uri() -> None:
    assert ssh_destination("qemu+ssh://virt@hv1.lan:2222/system") == ("virt@hv1.lan", 2222, "qemu:///system")
    assert ssh_destination("qemu+ssh://10.0.0.12/system?socket=/run/libvirt/libvirt-sock&x=1") == (
        "10.0.0.12",
        22,
        "qemu:///system?socket=/run/libvirt/libvirt-sock",
    )


def test_only_a_change_of_what_is_delivered_or_where_redelivers() -> None:
    provider = GuestCredentialsProvider()
    assert not provider.diff("id", dict(PROPS), dict(PROPS)).changes
    for key, value in (("password", "rotated"), ("domainId", "uuid-2")):
        diff = provider.diff("id", dict(PROPS), {**PROPS, key: value})
        assert diff.changes
        assert not diff.replaces


@pytest.mark.parametrize(("content", "ok"), [(f"crawler:{PASSWORD}\n", True), ("crawler:pa ss;rm\n", False)])
def test_the_setup_reads_the_delivered_file_and_refuses_unsafe_values(
    tmp_path: Path, content: str, ok: bool
) -> None:
    delivered = tmp_path / "credentials"
    delivered.write_text(content)
    script = "set -euo pipefail\n" + file_fetch(str(delivered)) + 'echo "$PROXY_USERNAME $PROXY_PASSWORD"\n'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)

    assert (done.returncode == 0) is ok
    if ok:
        assert done.stdout == f"crawler {PASSWORD}\n"
