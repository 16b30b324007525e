"""`proxy-operator serve` with a `kvm` provider, end to end against the test KVM host (tests/kvm/host.py):
the real engine, the kvm program on libvirt-python, libvirtd reached over SSH through a catalogue URI with a
port (`qemu+ssh://root@10.246.0.2:2222/system`, as the example catalogue's second host), a guest booted
under TCG, the health engine and the discovery API.

The service runs inside the host's namespace, the only place the guests' network (libvirt's NAT network,
192.168.122.0/24) is reachable from: its probes and a crawler's requests go through the VM from there, as
they would from a machine beside a real KVM host. The test reaches the API from outside, on the namespace's
veth address.

One Proxy goes through its life: it boots and its proxy answers (407 without credentials, 200 to a web
server in the namespace that its egress policy allows, refused for a private address it does not allow);
its VM, removed by hand, is found gone (by the resync, or sooner by its failing probes, which send the
service to check the stack) and, with driftPolicy `correct`, made again; a spec change
(more memory) replaces the VM on the same disk; and with skip-cleanup its deletion forgets it, leaving the VM
running, which `proxy-operator orphans` then lists and removes with its disks (never the base image).

Nothing is mocked. One guest at a time: each takes a core while it boots.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import ROOT
from tests.kvm.checks import BRIDGE_IP, REFUSED_IP, HostView, site, ssh_dir, through
from tests.kvm.host import KvmHost
from tests.kvm.images import GuestImage

pytestmark = pytest.mark.engine
API_PORT = 18080  # inside the namespace: nothing else listens there
PROXY_PORT = 3128
DOMAIN = "px-crawl-alpha"
SKIP_CLEANUP = "crawl.example.com/skip-cleanup"
BOOT_SECONDS = 420.0  # upload, TCG boot, credentials delivery, first probe; about 60-90 s measured


@dataclass
class Served:
    host: KvmHost
    manifests: Path
    state: Path
    ssh_dir: Path
    process: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str]

    @property
    def base(self) -> str:
        return f"http://{self.host.address}:{API_PORT}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {(self.state / 'dev-token').read_text().strip()}"}

    def write_proxy(self, *, memory_mib: int = 512, annotations: dict[str, str] | None = None) -> None:
        spec = {
            "provider": "kvm-test",
            "port": PROXY_PORT,
            "auth": {"mode": "generated"},
            "allowedSourceRanges": ["192.168.122.0/24"],
            "egress": {"allow": [{"cidr": f"{BRIDGE_IP}/32", "ports": [8089]}]},
            "kvm": {"memoryMib": memory_mib, "diskGib": 3},
        }
        metadata: dict[str, Any] = {"name": "alpha", "namespace": "crawl"}
        if annotations:
            metadata["annotations"] = annotations
        document = {"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy", "metadata": metadata}
        (self.manifests / "alpha.yaml").write_text(yaml.safe_dump({**document, "spec": spec}))

    def lease(self, target: str, *, timeout: float, why: str) -> dict[str, Any]:
        """A lease on the proxy once it is healthy (a new target each time: no cooldown in the way)."""
        deadline = time.monotonic() + timeout
        last = "the API never answered"
        with httpx.Client(base_url=self.base, timeout=10) as client:
            while time.monotonic() < deadline:
                self.check_running()
                try:
                    answer = client.post("/v1/leases", json={"target": target}, headers=self.headers())
                except (httpx.TransportError, FileNotFoundError) as exc:
                    last = repr(exc)
                else:
                    if answer.status_code == 200:
                        return dict(answer.json()["leases"][0])
                    assert answer.status_code == 503, answer.text
                    last = f"{answer.text}; status: {self.status()}"
                time.sleep(1)
        raise AssertionError(f"{why}: no lease within {timeout:.0f} s: {last}\n{self.tail()}")

    def status(self) -> Any:
        """The Proxy's status; its HTTP status code when there is none; None while the API is not up."""
        try:
            with httpx.Client(base_url=self.base, timeout=10) as client:
                answer = client.get("/v1/status/crawl/alpha", headers=self.headers())
        except (httpx.TransportError, FileNotFoundError):
            return None
        return answer.json() if answer.status_code == 200 else answer.status_code

    def check_running(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(f"the service exited ({self.process.returncode}):\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        command = [str(Path(sys.executable).parent / "proxy-operator"), *argv]
        return subprocess.run(
            [*self.host.enter(), *command], env=self.env, capture_output=True, text=True, timeout=300
        )


@pytest.fixture
def served(
    kvm_host: KvmHost, fast_image: GuestImage, libvirt: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Served]:
    """`serve` in the namespace; `indirect` parametrization with {"right_key": False} mounts a known_hosts
    that records another key for the host."""
    right_key = bool(getattr(request, "param", {}).get("right_key", True))
    view = HostView(libvirt, kvm_host)
    volumes_before = view.volumes()
    manifests, state = tmp_path / "manifests", tmp_path / "state"
    manifests.mkdir()
    catalogue = {
        "providers": [
            {
                "name": "kvm-test",
                "type": "kvm",
                "domainType": "qemu",
                "driftPolicy": "correct",
                "baseImage": str(fast_image.path),
                "pool": kvm_host.pool,
                "network": kvm_host.network,
                "hosts": [{"name": "hv1", "uri": kvm_host.catalogue_uri}],
            }
        ]
    }
    (manifests / "catalogue.yaml").write_text(yaml.safe_dump(catalogue))
    ssh = ssh_dir(kvm_host, tmp_path / "ssh", right_key=right_key)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),  # the dynamic providers unpickle stacks.programs.* by reference
        "PROXY_OPERATOR_KVM_SSH_DIR": str(ssh),
        "PROXY_OPERATOR_STATE_DIR": str(state),
        # the guests reach the service on the bridge: the probe goes through the VM to this echo
        "PROXY_OPERATOR_HEALTH_PROBE_URL": f"http://{BRIDGE_IP}:{API_PORT}/v1/echo",
        "PROXY_OPERATOR_HEALTH_INTERVAL_SECONDS": "2",
        "PROXY_OPERATOR_HEALTH_HEALTHY_THRESHOLD": "1",
        "PROXY_OPERATOR_RESYNC_SECONDS": "15",
    }
    log = tmp_path / "serve.log"
    command = [str(Path(sys.executable).parent / "proxy-operator"), "serve", "--manifests", str(manifests)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*kvm_host.enter(), *command, "--host", "0.0.0.0", "--port", str(API_PORT)],
            env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield Served(kvm_host, manifests, state, ssh, process, log, env)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        # a failed test must not leave a guest running; the base image goes too (a real host keeps it)
        view.clean(domains_prefix=DOMAIN, keep_volumes=volumes_before)


def test_serve_runs_a_kvm_proxy_through_boot_lease_drift_change_and_forget(
    served: Served,
    kvm_host: KvmHost,
    fast_image: GuestImage,
    libvirt: Any,
    say: Callable[[str], None],
) -> None:
    view = HostView(libvirt, kvm_host)
    volumes_before = view.volumes()
    started = time.monotonic()
    served.write_proxy()
    lease = served.lease("boot.example.com", timeout=BOOT_SECONDS, why="the first boot")
    say(f"kvm proxy leasable {time.monotonic() - started:.1f} s after its manifest was written")
    assert lease["host"].startswith("192.168.122."), lease
    assert lease["port"] == PROXY_PORT
    assert lease["provider"] == "kvm-test"
    first_uuid, active, memory = view.domains()[DOMAIN]
    assert active
    assert memory == 512
    added = view.volumes() - volumes_before
    assert f"{DOMAIN}.qcow2" in added, added
    assert any(v.endswith("-cloudinit.iso") for v in added), added
    [base] = [v for v in added if v.startswith(fast_image.path.stem)]  # the host's image cache

    with site(kvm_host) as site_port:
        allowed, refused = f"http://{BRIDGE_IP}:{site_port}/", f"http://{REFUSED_IP}:{site_port}/"

        def answers(leased: dict[str, Any], url: str, *, creds: bool = True) -> int:
            login = f"{leased['username']}:{leased['password']}" if creds else ""
            return through(kvm_host, proxy=leased["host"], port=leased["port"], url=url, creds=login)

        assert answers(lease, allowed, creds=False) == 407
        assert answers(lease, allowed) == 200
        assert answers(lease, refused) != 200  # the egress policy, inside the VM

        # Drift: the VM removed by hand is found by the resync and, with driftPolicy correct, made again.
        started = time.monotonic()
        view.remove_domain(DOMAIN)
        again = _lease_from_a_new_domain(served, view, first_uuid, target="drift.example.com")
        say(f"kvm drift: VM removed by hand, leasable again after {time.monotonic() - started:.1f} s")
        assert answers(again, allowed) == 200
        second_uuid = view.domains()[DOMAIN][0]

        # A spec change: more memory replaces the VM, which boots the same disk.
        started = time.monotonic()
        served.write_proxy(memory_mib=640)
        changed = _lease_from_a_new_domain(served, view, second_uuid, target="change.example.com")
        say(f"kvm spec change: leasable again after {time.monotonic() - started:.1f} s")
        assert view.domains()[DOMAIN][2] == 640
        assert answers(changed, allowed) == 200

    # skip-cleanup: the deletion forgets the proxy; its VM keeps running, and is now an orphan.
    served.write_proxy(memory_mib=640, annotations={SKIP_CLEANUP: "true"})
    time.sleep(3)  # the annotation is read before the file goes (a poll is 1 s)
    (served.manifests / "alpha.yaml").unlink()
    deadline = time.monotonic() + 120
    while "Released" not in [event["reason"] for event in (served.status() or {"events": []})["events"]]:
        assert time.monotonic() < deadline, f"the proxy was not forgotten: {served.status()}"
        time.sleep(1)
    reasons = [event["reason"] for event in served.status()["events"]]
    assert "Forgotten" in reasons, reasons
    assert view.domains()[DOMAIN][1], "skip-cleanup keeps the VM running"
    listed = served.cli("orphans", "--manifests", str(served.manifests))
    assert listed.returncode == 0, listed.stderr
    assert f"domain {DOMAIN} on hv1" in listed.stdout, listed.stdout
    removed = served.cli("orphans", "--manifests", str(served.manifests), "--delete", "--yes")
    assert removed.returncode == 0, removed.stderr
    assert DOMAIN not in view.domains()
    left = view.volumes() - volumes_before
    assert base in left, left  # the image cache stays
    assert not any(v.startswith(DOMAIN) for v in left), left


def _lease_from_a_new_domain(served: Served, view: HostView, old_uuid: str, *, target: str) -> dict[str, Any]:
    """A lease on the new domain: once it is there, a lease whose address is the new domain's (until the
    service published it, and while the old address still looks healthy, a lease may name the old one)."""
    deadline = time.monotonic() + BOOT_SECONDS
    while (view.domains().get(DOMAIN) or (old_uuid,))[0] == old_uuid:
        served.check_running()
        assert time.monotonic() < deadline, f"no new domain: {served.status()}\n{served.tail()}"
        time.sleep(2)
    for attempt in range(1000):
        left = deadline - time.monotonic()
        lease = served.lease(f"{attempt}.{target}", timeout=max(left, 1), why="the new domain")
        address = view.address(DOMAIN)
        if address is not None and lease["host"] == address:
            return lease
        assert time.monotonic() < deadline, f"leases still name {lease['host']}, the domain is at {address}"
        time.sleep(2)
    raise AssertionError("unreachable")


@pytest.mark.parametrize("served", [{"right_key": False}], indirect=True)
def test_serve_stalls_a_proxy_whose_host_key_is_not_the_known_one_and_creates_nothing(
    served: Served, kvm_host: KvmHost, libvirt: Any
) -> None:
    """The Proxy itself says what is wrong and how to fix it, and the host holds nothing new. A permanent
    error: Provisioned=False with the reason at once, Stalled=True after three failures in a row (retried
    only by the resync, as the fix is in the Secret's files, which the service does not watch)."""
    view = HostView(libvirt, kvm_host)
    before = (set(view.domains()), view.volumes())
    served.write_proxy()
    deadline = time.monotonic() + 120
    while True:
        served.check_running()
        status = served.status()
        conditions = status["status"]["conditions"] if isinstance(status, dict) else []
        failed = [c for c in conditions if c["type"] in ("Provisioned", "Stalled") and c.get("message")]
        if failed:
            break
        assert time.monotonic() < deadline, f"no condition says why: {status}\n{served.tail()}"
        time.sleep(1)
    assert failed[0]["reason"] == "InvalidInput", failed
    message = failed[0]["message"]
    assert f"[{kvm_host.address}]:{kvm_host.port}" in message, message
    assert "known_hosts" in message, message
    assert "ssh-keyscan" in message, message
    assert (set(view.domains()), view.volumes()) == before
