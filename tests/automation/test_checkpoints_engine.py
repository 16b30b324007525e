"""`checkpoints: end` (a shared `local` entry's state saved once, when the `up` ends) through the product's
own `proxy-operator up` and the real engine: an `up` SIGKILLed half-way (the service's process group, the CLI,
then its language host and dynamic provider, which die with the CLI, as on a lost node) saved nothing of
what it made, left no plugin running,
and the next `up` takes back every port the listener already serves instead of serving a proxy twice:
the same listener, each proxy on its own port once, its credentials the ones the state now holds."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from automation.engine import Engine, EngineConfig
from stacks.programs.local_listener import SharedListener
from tests.automation.fleet import accepts, proxy_doc
from tests.conftest import ROOT, PulumiEnv
from tests.ports import free_port
from tests.security.loopback_site import serve_page

pytestmark = pytest.mark.engine

ENTRY = "bulk"
COUNT = 60
KILL_AFTER = 8  # ports served when the up is killed (of COUNT)


class Bulk:
    def __init__(self, root: Path, env: PulumiEnv, origin: int) -> None:
        self.root, self.origin, self.backend_url = root, origin, env.backend_url
        self.manifests, self.state, self.local = root / "manifests", root / "state", root / "local"
        self.manifests.mkdir()
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "PROXY_OPERATOR_BACKEND_URL": env.backend_url,
            "PROXY_OPERATOR_STATE_DIR": str(self.state),
        }
        self.engine = Engine(EngineConfig(backend_url=env.backend_url, state_dir=root / "reader"))
        self.ports: dict[str, int] = {}

    def declare(self, checkpoints: str) -> None:
        entry = {"name": ENTRY, "type": "local", "stateDir": str(self.local)}
        entry |= {"processModel": "shared", "checkpoints": checkpoints}
        (self.manifests / "catalogue.yaml").write_text(yaml.safe_dump({"providers": [entry]}))
        allow = [{"cidr": "127.0.0.1/32", "ports": [self.origin]}]
        for i in range(COUNT):
            name = f"p{i:02d}"
            self.ports[f"crawl/{name}"] = port = free_port()
            document = proxy_doc(name, provider=ENTRY, port=port, egress={"allow": allow})
            (self.manifests / f"proxy-{name}.yaml").write_text(yaml.safe_dump(document))

    def command(self) -> list[str]:
        cli = Path(sys.executable).parent / "proxy-operator"
        return [str(cli), "up", "--manifests", str(self.manifests)]

    def up(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(), env=self.env, capture_output=True, text=True, timeout=600, cwd=self.root
        )

    def kill_half_way(self) -> int:
        """Start `proxy-operator up` in a process group of its own and SIGKILL the group once KILL_AFTER
        ports accept; the number that accepted then."""
        victim = subprocess.Popen(
            self.command(),
            env=self.env,
            cwd=self.root,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 300
        served = 0
        while time.monotonic() < deadline and victim.poll() is None:
            served = self.serving()
            if served >= KILL_AFTER:
                break
            time.sleep(0.01)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        return served

    def serving(self) -> int:
        return sum(1 for port in self.ports.values() if accepts(port))

    def listener(self) -> dict[str, Any]:
        return json.loads((self.local / f"_shared-{ENTRY}.pid").read_text())

    def in_state(self) -> list[str]:
        """The proxies the backend's state holds (its LocalProxy resources)."""
        resources = self.engine.export(ENTRY).get("deployment", {}).get("resources") or []
        return sorted(r["outputs"]["key"] for r in resources if r["type"].endswith("LocalProxy"))

    def stop_listener(self) -> None:
        out = subprocess.run(["pgrep", "-f", str(self.local)], capture_output=True, text=True)
        for pid in (int(p) for p in out.stdout.split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def plugins_left(self) -> dict[int, str]:
        """The processes of this test's Pulumi calls still running (each holds the test's backend, a folder of
        its own, in its environment), the proxies' listener aside: pid -> command line."""
        marker = f"PULUMI_BACKEND_URL={self.backend_url}".encode()
        listeners = str(self.local).encode()
        left = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
                command = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:  # ended, or not ours to read
                continue
            if marker in environ and listeners not in command and state != "Z":
                left[int(entry.name)] = command.replace(b"\0", b" ").decode(errors="replace")
        return left

    def stop_orphaned_plugins(self) -> None:
        """Stops what `plugins_left` finds, so that a failed test leaves no process behind."""
        for pid in self.plugins_left():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def bulk(pulumi_env: PulumiEnv, tmp_path: Path) -> Iterator[Bulk]:
    with serve_page(b"through a taken-back port\n") as origin:
        made = Bulk(tmp_path, pulumi_env, origin)
        try:
            yield made
        finally:
            made.stop_listener()
            made.stop_orphaned_plugins()


def test_an_up_killed_half_way_saved_nothing_and_the_next_takes_every_served_port_back(bulk: Bulk) -> None:
    bulk.declare("end")
    served = bulk.kill_half_way()
    assert KILL_AFTER <= served < COUNT, f"killed with {served} of {COUNT} served: not half-way"
    # The language host and the dynamic provider are not in the killed process group: they end because
    # their parent, the CLI, did (automation.parent_watch), so no Create can finish after the kill.
    deadline = time.monotonic() + 20
    while (left := bulk.plugins_left()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"plugins outlived the SIGKILLed CLI: {left}"
    listener = bulk.listener()
    assert bulk.in_state() == [], "checkpoints: end saved a step before the up ended"

    again = bulk.up()  # the killed up's lock: its pid is gone on this host, so it is taken over
    assert again.returncode == 0, again.stderr[-3000:]
    assert bulk.listener() == listener, "the ports were not taken back: a new listener serves them"
    assert bulk.in_state() == sorted(bulk.ports)
    shared = SharedListener(bulk.local, ENTRY)
    for key, port in bulk.ports.items():  # each proxy served once, on its own port
        assert shared.call({"op": "status", "proxy": key})["served"]["port"] == port, key
    outputs = bulk.engine.plain_outputs(ENTRY)
    for key in sorted(bulk.ports)[:: COUNT // 6]:  # the credentials the state holds are the ones served
        endpoint, creds = outputs["proxies"][key], outputs["credentials"][key]
        proxy = f"http://{creds['username']}:{creds['password']}@127.0.0.1:{endpoint['port']}"
        with httpx.Client(proxy=proxy, timeout=10) as client:
            assert client.get(f"http://127.0.0.1:{bulk.origin}/").status_code == 200, key
