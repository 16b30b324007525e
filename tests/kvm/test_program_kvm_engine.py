"""The kvm program through the real Pulumi engine against the test KVM host (tests/kvm/host.py): libvirtd in a
namespace of its own, reached over SSH with a `qemu+ssh://root@10.246.0.2:2222/system` catalogue URI (a port,
as the example catalogue's second host), dialled over OpenSSH with the key and known_hosts (`libvirt_conn`).

`up` of one kvm Proxy on the fast guest image (domain type `qemu`: TCG; this machine's /dev/kvm cannot run
stock guest kernels) uploads the base image, makes the overlay, the cidata disk and the domain, waits for its
lease, and delivers the generated credentials over SSH and the guest agent; the proxy then answers from inside
the namespace: 407 without credentials, 200 through to a web server in the namespace that the egress policy
allows, and not 200 to the same server at an address the policy refuses (private ranges). `destroy` removes
the domain, the overlay and the cidata disk and keeps the base image. A known_hosts without the host's key
stalls the stack (a permanent error naming the host and the fix) with nothing created, and a domain type the
host cannot run fails within seconds.

Nothing is mocked. One guest at a time: each takes a core while it boots.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pulumi import automation as auto

from automation.engine.errors import translate
from automation.errors import PermanentError
from automation.orphans import state_ids
from automation.orphans.kvm import KvmHosts, kvm_orphans
from stacks.models import KvmProvider
from tests.conftest import ROOT, PulumiEnv
from tests.kvm.checks import BRIDGE_IP, REFUSED_IP, SITE_PORT, HostView, site, ssh_dir, through
from tests.kvm.host import KvmHost
from tests.kvm.images import GuestImage

pytestmark = pytest.mark.engine
PROXY_PORT = 3128
KEY = "crawl/alpha"
INSTALLATION = "kvm-test-install"


@dataclass
class KvmStack:
    stack: auto.Stack
    host: KvmHost
    entry: dict[str, Any]
    ssh_dir: Path
    proxies: list[dict[str, Any]] = field(default_factory=list)

    def up(self) -> dict[str, Any]:
        self.stack.set_config("proxy-operator:provider", auto.ConfigValue(json.dumps(self.entry)))
        self.stack.set_config("proxy-operator:proxies", auto.ConfigValue(json.dumps(self.proxies)))
        result = self.stack.up()
        return {key: value.value for key, value in result.outputs.items()}

    def through(self, endpoint: dict[str, Any], url: str, creds: str = "") -> int:
        return through(self.host, proxy=endpoint["host"], port=endpoint["port"], url=url, creds=creds)


def _entry(host: KvmHost, image: GuestImage, *, domain_type: str = "qemu") -> dict[str, Any]:
    return {
        "name": "kvm-test",
        "type": "kvm",
        "domainType": domain_type,
        "baseImage": str(image.path),
        "pool": host.pool,
        "network": host.network,
        "hosts": [{"name": "hv1", "uri": host.catalogue_uri}],
    }


def _proxy(*, auth: str = "generated") -> dict[str, Any]:
    spec = {
        "provider": "kvm-test",
        "port": PROXY_PORT,
        "auth": {"mode": auth},
        "allowedSourceRanges": ["192.168.122.0/24"],
        "egress": {"allow": [{"cidr": f"{BRIDGE_IP}/32", "ports": [SITE_PORT]}]},
        "kvm": {"memoryMib": 512, "diskGib": 3},
    }
    return {"namespace": "crawl", "name": "alpha", "labels": {}, "spec": spec}


@pytest.fixture
def kvm_stack(
    pulumi_env: PulumiEnv, kvm_host: KvmHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., KvmStack]]:
    monkeypatch.setenv(
        "PYTHONPATH", str(ROOT)
    )  # the dynamic providers unpickle stacks.programs.* by reference
    # as the service's engine sets it for every CLI call (automation/engine/config.py): libvirt forks ssh
    monkeypatch.setenv("GRPC_ENABLE_FORK_SUPPORT", "false")
    made: list[KvmStack] = []

    def make(*, entry: dict[str, Any], right_key: bool = True) -> KvmStack:
        work = tmp_path / f"work-{len(made)}"
        work.mkdir()
        (work / "Pulumi.yaml").write_text(f"name: proxy-operator\nruntime: python\nmain: {ROOT / 'stacks'}\n")
        stack = auto.create_or_select_stack(stack_name=f"kvm-test-{len(made)}", work_dir=str(work))
        ssh = ssh_dir(kvm_host, tmp_path / f"ssh-{len(made)}", right_key=right_key)
        stack.set_config("proxy-operator:kvmSshDir", auto.ConfigValue(str(ssh)))
        stack.set_config("proxy-operator:installation", auto.ConfigValue(INSTALLATION))
        made.append(KvmStack(stack=stack, host=kvm_host, entry=entry, ssh_dir=ssh))
        return made[-1]

    yield make
    for kvm in made:  # a failed test must not leave a guest running
        kvm.stack.destroy()


@pytest.fixture
def view(libvirt: Any, kvm_host: KvmHost, kvm_stack: Any) -> Iterator[HostView]:
    """Torn down after the stacks (it needs kvm_stack): removes the base images the tests uploaded."""
    seen = HostView(libvirt, kvm_host)
    before = seen.volumes()
    yield seen
    seen.clean(domains_prefix="px-crawl-", keep_volumes=before)  # a real host keeps its image cache


def test_up_boots_the_proxy_which_answers_and_destroy_keeps_only_the_base_image(
    kvm_stack: Callable[..., KvmStack],
    kvm_host: KvmHost,
    fast_image: GuestImage,
    view: HostView,
    say: Callable[[str], None],
) -> None:
    kvm = kvm_stack(entry=_entry(kvm_host, fast_image))
    kvm.proxies = [_proxy()]
    started = time.monotonic()
    outputs = kvm.up()
    up_seconds = time.monotonic() - started

    endpoint = outputs["proxies"][KEY]
    assert endpoint["host"].startswith("192.168.122.")
    assert (endpoint["port"], endpoint["protocol"]) == (PROXY_PORT, "http")
    creds = outputs["credentials"][KEY]
    login = f"{creds['username']}:{creds['password']}"
    assert "px-crawl-alpha" in view.domains()
    volumes = view.volumes()
    assert "px-crawl-alpha.qcow2" in volumes
    [iso] = [v for v in volumes if v.endswith("-cloudinit.iso")]
    [base] = [v for v in volumes if v.startswith(fast_image.path.stem)]

    with site(kvm_host) as port:
        allowed, refused = f"http://{BRIDGE_IP}:{port}/", f"http://{REFUSED_IP}:{port}/"
        assert kvm.through(endpoint, allowed) == 407
        assert kvm.through(endpoint, allowed, login) == 200
        assert kvm.through(endpoint, refused, login) != 200

    preview = kvm.stack.preview()
    assert set(preview.change_summary) == {"same"}, preview.change_summary
    _the_orphan_finder_sees_the_vm_only_when_no_state_holds_it(kvm)

    started = time.monotonic()
    kvm.stack.destroy()
    destroy_seconds = time.monotonic() - started
    assert "px-crawl-alpha" not in view.domains()
    left = view.volumes()
    assert base in left  # the image cache stays for the next proxy
    assert not {"px-crawl-alpha.qcow2", iso} & left
    say(f"kvm proxy: up {up_seconds:.1f} s, destroy {destroy_seconds:.1f} s")


def test_a_known_hosts_without_the_hosts_key_stalls_the_stack_and_creates_nothing(
    kvm_stack: Callable[..., KvmStack], kvm_host: KvmHost, fast_image: GuestImage, view: HostView
) -> None:
    kvm = kvm_stack(entry=_entry(kvm_host, fast_image), right_key=False)
    kvm.proxies = [_proxy(auth="none")]
    before = (view.domains(), view.volumes())
    with pytest.raises(auto.errors.CommandError) as failed:
        kvm.up()

    error = translate(failed.value, stack="kvm-test-0")
    assert isinstance(error, PermanentError), error  # stalled until the input changes, not retried
    text = str(error)
    assert f"[{kvm_host.address}]:{kvm_host.port}" in text
    assert "known_hosts" in text
    assert (view.domains(), view.volumes()) == before


def test_a_domain_type_the_host_cannot_run_fails_within_seconds_naming_the_fix(
    kvm_stack: Callable[..., KvmStack], kvm_host: KvmHost, fast_image: GuestImage, view: HostView
) -> None:
    """This machine kind's /dev/kvm is paravirtual (kvm_pvm): a stock guest kernel pauses at once under
    domain type `kvm` (shared/notes/kvm-libvirt.md). On a host with working KVM this test would fail."""
    kvm = kvm_stack(entry=_entry(kvm_host, fast_image, domain_type="kvm"))
    kvm.proxies = [_proxy(auth="none")]
    started = time.monotonic()
    with pytest.raises(auto.errors.CommandError) as failed:
        kvm.up()
    assert time.monotonic() - started < 120  # not the 300 s address deadline
    assert "set domainType: qemu in the catalogue entry" in str(failed.value)
    assert "px-crawl-alpha" not in view.domains()  # the failed create removed its domain


def _the_orphan_finder_sees_the_vm_only_when_no_state_holds_it(kvm: KvmStack) -> None:
    """`proxy-operator orphans` against the real host: SSH and virsh there, as the service runs them."""
    hosts = KvmHosts(KvmProvider.model_validate(kvm.entry), str(kvm.ssh_dir))
    domains = hosts.domains()
    held = state_ids([{"deployment": kvm.stack.export_stack().deployment or {}}])
    assert kvm_orphans(domains, provider="kvm-test", installation=INSTALLATION, known=held) == []
    [orphan] = kvm_orphans(domains, provider="kvm-test", installation=INSTALLATION, known=set())
    assert (orphan.name, orphan.location) == ("px-crawl-alpha", "hv1")
