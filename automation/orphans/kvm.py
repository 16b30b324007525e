"""KVM orphans: libvirt domains whose description carries our marks and this installation's id
(`managed-by=proxy-operator ... installation=<id>`) and whose UUID (the provider's id) no stack's state holds.

Each host of the entry is reached as the credentials delivery reaches it (`stacks/kvm_ssh.py`: the mounted
key and known_hosts, host keys verified); a POSIX script piped into `sh -s` there lists the domains with
`virsh list --all --name`, `domuuid` and `desc`. Deleting one destroys it and undefines it with its storage
(its own disk and cloud-init ISO; the cached base image is a backing file, not a disk of the domain).
tests/pools/test_orphans_kvm.py runs the scripts in a local `sh` against a fake `virsh`; tests/kvm runs
them over SSH against the test KVM host's libvirtd.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from automation.orphans.model import Orphan
from stacks.kvm_ssh import ssh_argv, ssh_destination
from stacks.marks import carries_installation
from stacks.models import KvmProvider

# The kvm program's domain resource (stacks/programs/libvirt_domain.py), and pulumi-libvirt's in stacks made
# before it (docs/decisions.md): both keep the domain's UUID as the resource id.
DOMAIN_TYPES = ("pulumi-python:dynamic/proxy-operator:LibvirtDomain", "libvirt:index/domain:Domain")
SSH_TIMEOUT_SECONDS = 120

Runner = Callable[[Sequence[str], str], "subprocess.CompletedProcess[str]"]


@dataclass(frozen=True)
class Domain:
    host: str  # the catalogue's host name
    name: str
    uuid: str
    description: str


def list_script(libvirt_uri: str) -> str:
    """One line per domain: name, UUID, description (tabs and newlines in it made spaces)."""
    return f"""set -eu
URI={shlex.quote(libvirt_uri)}
DOMS=$(virsh -q -c "$URI" list --all --name)  # set -e: a failing virsh fails the script
printf '%s\n' "$DOMS" | while read -r DOM; do
  [ -n "$DOM" ] || continue
  UUID=$(virsh -q -c "$URI" domuuid "$DOM")
  DESC=$(virsh -q -c "$URI" desc "$DOM" 2>/dev/null | tr '\\t\\n' '  ' || true)
  printf '%s\\t%s\\t%s\\n' "$DOM" "$UUID" "$DESC"
done
"""


def delete_script(libvirt_uri: str, uuid: str) -> str:
    uri, dom = shlex.quote(libvirt_uri), shlex.quote(uuid)
    return (
        f"set -eu\nvirsh -q -c {uri} destroy {dom} >/dev/null 2>&1 || true\n"
        f"virsh -q -c {uri} undefine {dom} --remove-all-storage\n"
    )


def parse_domains(host: str, text: str) -> list[Domain]:
    domains = []
    for line in text.splitlines():
        name, _, rest = line.partition("\t")
        uuid, _, description = rest.partition("\t")
        if name and uuid:
            domains.append(Domain(host, name.strip(), uuid.strip(), description.strip()))
    return domains


def run_ssh(argv: Sequence[str], script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), input=script, capture_output=True, text=True, timeout=SSH_TIMEOUT_SECONDS, check=False
    )


@dataclass
class KvmHosts:
    """The entry's hosts over SSH (`runner` stands in for `ssh` in the tests)."""

    entry: KvmProvider
    ssh_dir: str
    runner: Runner = run_ssh

    def domains(self) -> list[Domain]:
        found = []
        for host in self.entry.hosts:
            found += parse_domains(host.name, self._run(host.name, list_script))
        return found

    def delete(self, host_name: str, uuid: str) -> bool:
        self._run(host_name, lambda uri: delete_script(uri, uuid))
        return True

    def _run(self, host_name: str, script: Callable[[str], str]) -> str:
        host = self.entry.host(host_name)
        assert host is not None, f"{host_name} is a host of {self.entry.name}"
        target, port, libvirt_uri = ssh_destination(host.uri)
        done = self.runner(ssh_argv(target=target, port=port, ssh_dir=self.ssh_dir), script(libvirt_uri))
        if done.returncode != 0:
            raise RuntimeError(
                f"virsh over SSH on {target} (host {host_name} of {self.entry.name}) failed "
                f"(exit {done.returncode}): {done.stderr.strip()[-300:]}"
            )
        return done.stdout


def kvm_orphans(
    domains: Sequence[Domain], *, provider: str, installation: str, known: set[tuple[str, str]]
) -> list[Orphan]:
    return [
        Orphan(provider, "domain", d.uuid, f"domain {d.name} on {d.host}", name=d.name, location=d.host)
        for d in domains
        if carries_installation(d.description, installation)
        and not any((kind, d.uuid) in known for kind in DOMAIN_TYPES)
    ]


def delete_kvm(hosts: KvmHosts, orphan: Orphan) -> bool:
    return hosts.delete(orphan.location, orphan.id)
