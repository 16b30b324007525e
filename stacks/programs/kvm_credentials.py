"""KVM proxy credentials delivered into the guest over SSH, never through cloud-init (issue 11).

The cloud-init disk sits in the host's storage pool, where anyone who can read the pool (`virsh
vol-download`, image backups) reads its user-data; so the user-data carries the setup script with
placeholders and a small receiver, `RECEIVER_PATH`, that writes what it reads on stdin into the root-only
`CREDENTIALS_PATH` (0600 in a 0700 folder) and runs the setup, which reads it (`boot_credentials`).

`GuestCredentials` is a dynamic resource that feeds the receiver: it opens SSH to the KVM host with the key
and known_hosts the libvirt provider uses (host keys verified), and pipes a POSIX script into `sh -s`
there. The script waits for the guest agent (the libvirt provider gives every domain its channel; the
user-data installs `qemu-guest-agent`), then runs the receiver with `guest-exec`, the credentials as its
`input-data` (again each second while the guest has no receiver yet: an agent in the image answers before
cloud-init wrote it), and waits for it to exit 0. The credentials travel only on SSH's stdin and the agent's
channel: never on a command line on the host, in the domain XML, the pool or the stack's plain inputs
(they are secret in the state). A rotation re-runs the receiver in the running VM (no replacement); a new
domain gets them again.

Needs an OpenSSH client (`ssh`) where the program's dynamic providers run. `tests/security/
test_kvm_credentials.py` runs the host script against a fake `virsh`; `tests/kvm` against a real host and
guest.
"""

from __future__ import annotations

import base64
import json
import shlex
import shutil
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider, UpdateResult

from stacks.kvm_ssh import ssh_argv, ssh_destination

CREDENTIALS_DIR = "/etc/proxy-operator"
CREDENTIALS_PATH = f"{CREDENTIALS_DIR}/credentials"
RECEIVER_PATH = "/usr/local/sbin/proxy-operator-credentials"
AGENT_WAIT_TRIES, EXEC_WAIT_TRIES, POLL_SECONDS = 120, 180, 5  # 10 minutes to boot, 15 to set up
RECEIVER_WAIT_TRIES, RECEIVER_POLL_SECONDS = 300, 1  # 5 minutes for cloud-init to write the receiver
SSH_TIMEOUT_SECONDS = 30 * 60
EOF_MARK = "PROXY_OPERATOR_EOF"
DELIVERY_KEYS = ("sshTarget", "sshPort", "libvirtUri", "domain", "domainId", "username", "password")

Runner = Callable[[Sequence[str], str], "subprocess.CompletedProcess[str]"]


def receiver_script(setup_path: str) -> str:
    """The guest side: stdin into the root-only credentials file, then the setup (once cloud-init is done)."""
    return (
        "#!/bin/bash\n# proxy-operator: credentials from the host's guest agent (stdin), then the setup.\n"
        "set -euo pipefail\n"
        f"install -d -m 0700 {CREDENTIALS_DIR}\n"
        f"(umask 077; head -c 300 > {CREDENTIALS_PATH}.new)\n"
        f"mv {CREDENTIALS_PATH}.new {CREDENTIALS_PATH}\n"
        "cloud-init status --wait >/dev/null 2>&1 || true\n"
        f"exec {setup_path}\n"
    )


def _agent_exec(domain: str, payload: str) -> str:
    command = {
        "execute": "guest-exec",
        "arguments": {"path": RECEIVER_PATH, "input-data": payload, "capture-output": True},
    }
    return f"qemu-agent-command {domain} '{json.dumps(command, separators=(',', ':'))}'"


def delivery_script(*, libvirt_uri: str, domain: str, username: str, password: str) -> str:
    """POSIX sh for the host. The credentials sit in a here-document fed to virsh's own shell, so they
    never appear in any process's arguments there."""
    payload = base64.b64encode(f"{username}:{password}".encode()).decode()
    fail = 'echo "proxy-operator: $1 ($DOM)" >&2; exit 1'
    return f"""set -eu
URI={shlex.quote(libvirt_uri)}; DOM={shlex.quote(domain)}
fail() {{ {fail}; }}
agent() {{ virsh -q -c "$URI" qemu-agent-command "$DOM" "$1"; }}
i=0
until agent '{{"execute":"guest-ping"}}' >/dev/null 2>&1; do
  i=$((i+1)); [ "$i" -lt {AGENT_WAIT_TRIES} ] || fail "the guest agent never answered"
  sleep {POLL_SECONDS}
done
i=0
# The agent may answer before cloud-init wrote the receiver: ask again, fail at once on anything else.
# (virsh reading its commands from stdin exits 0 even when the command failed: the answer decides.)
while :; do
  OUT=$(virsh -q -c "$URI" 2>&1 <<'{EOF_MARK}'
{_agent_exec(domain, payload)}
{EOF_MARK}
) || true
  PID=$(printf '%s' "$OUT" | sed -n 's/.*"pid": *\\([0-9][0-9]*\\).*/\\1/p')
  [ -z "$PID" ] || break
  case "$OUT" in
    *"No such file or directory"*) ;;
    *) fail "guest-exec of the credentials receiver failed: $OUT" ;;
  esac
  i=$((i+1))
  [ "$i" -lt {RECEIVER_WAIT_TRIES} ] || fail "cloud-init never wrote {RECEIVER_PATH} in the guest: $OUT"
  sleep {RECEIVER_POLL_SECONDS}
done
i=0
while :; do
  STATUS=$(agent "{{\\"execute\\":\\"guest-exec-status\\",\\"arguments\\":{{\\"pid\\":$PID}}}}")
  printf '%s' "$STATUS" | grep -Eq '"exited": *true' && break
  i=$((i+1)); [ "$i" -lt {EXEC_WAIT_TRIES} ] || fail "the proxy setup did not finish"
  sleep {POLL_SECONDS}
done
printf '%s' "$STATUS" | grep -Eq '"exitcode": *0[,}} ]' || fail "the proxy setup failed in the guest: $STATUS"
"""


def run_ssh(argv: Sequence[str], script: str) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        raise RuntimeError(
            "the kvm program delivers proxy credentials over SSH and found no `ssh`: install an OpenSSH "
            "client where the service runs"
        )
    return subprocess.run(
        list(argv), input=script, capture_output=True, text=True, timeout=SSH_TIMEOUT_SECONDS, check=False
    )


class GuestCredentialsProvider(ResourceProvider):
    """Create and update deliver; delete does nothing (the file goes with the domain's disk)."""

    def __init__(self, runner: Runner = run_ssh) -> None:
        super().__init__()
        self._runner = runner

    def _deliver(self, props: dict[str, Any]) -> None:
        argv = ssh_argv(target=props["sshTarget"], port=int(props["sshPort"]), ssh_dir=props["sshDir"])
        script = delivery_script(
            libvirt_uri=props["libvirtUri"],
            domain=props["domain"],
            username=props["username"],
            password=props["password"],
        )
        done = self._runner(argv, script)
        if done.returncode != 0:
            raise RuntimeError(
                f"delivering the credentials of {props['domain']} over SSH to {props['sshTarget']} failed "
                f"(exit {done.returncode}): {done.stderr.strip()[-500:]}"
            )

    def create(self, props: dict[str, Any]) -> CreateResult:
        self._deliver(props)
        return CreateResult(id_=f"{props['domain']}-credentials", outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = any(olds.get(key) != news.get(key) for key in DELIVERY_KEYS)
        return DiffResult(changes=changed, replaces=[], delete_before_replace=False)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        self._deliver(news)
        return UpdateResult(outs=news)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        return ReadResult(id_=id_, outs=props)


class GuestCredentials(Resource, module="proxy-operator", name="GuestCredentials"):
    """The proxy's credentials written into its running guest; `username` and `password` stay secret."""

    def __init__(
        self,
        name: str,
        *,
        host_uri: str,
        ssh_dir: str,
        domain: pulumi.Input[str],
        domain_id: pulumi.Input[str],
        username: pulumi.Input[str],
        password: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        target, port, libvirt_uri = ssh_destination(host_uri)
        props = {
            "sshTarget": target,
            "sshPort": port,
            "sshDir": ssh_dir,
            "libvirtUri": libvirt_uri,
            "domain": domain,
            "domainId": domain_id,
            "username": pulumi.Output.secret(username),
            "password": pulumi.Output.secret(password),
        }
        secret = pulumi.ResourceOptions(additional_secret_outputs=["username", "password"])
        super().__init__(GuestCredentialsProvider(), name, props, pulumi.ResourceOptions.merge(opts, secret))
