"""`processModel: shared` through the real Pulumi engine: one listener process serves every proxy of the
stack, each on its own port with its own credentials and egress policy; edits, a port change, a removal, a
crash of the listener, and a switch between the process models, with requests through the proxies."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pulumi import automation as auto

from stacks.forward_proxy.identity import ProcessRef
from stacks.programs import local_process as proc
from tests.conftest import ROOT, PulumiEnv
from tests.ports import free_port
from tests.security.loopback_site import serve_page

PAGE = b"one listener, many proxies\n"
pytestmark = pytest.mark.engine


class SharedStack:
    def __init__(self, stack: auto.Stack, state: Path, origin_port: int) -> None:
        self.stack = stack
        self.state = state
        self.origin_port = origin_port
        self.entry: dict[str, Any] = {"name": "shared-test", "type": "local", "stateDir": str(state)}
        self.entry["processModel"] = "shared"
        self.proxies: dict[str, dict[str, Any]] = {}
        self.outputs: dict[str, Any] = {}
        self.seen: set[ProcessRef] = set()

    def add(self, name: str, *, reaches_origin: bool) -> None:
        allow = [{"cidr": "127.0.0.1/32", "ports": [self.origin_port]}] if reaches_origin else []
        spec = {"provider": "shared-test", "port": free_port(), "egress": {"allow": allow}}
        self.proxies[name] = {"namespace": "crawl", "name": name, "labels": {}, "spec": spec}

    def up(self, *, refresh: bool = False) -> None:
        self.stack.set_config("proxy-operator:provider", auto.ConfigValue(json.dumps(self.entry)))
        proxies = json.dumps(list(self.proxies.values()))
        self.stack.set_config("proxy-operator:proxies", auto.ConfigValue(proxies))
        result = self.stack.up(refresh=refresh)
        self.outputs = {key: value.value for key, value in result.outputs.items()}
        self.seen |= set(self.instances().values())

    def instances(self) -> dict[str, ProcessRef]:
        refs = {
            key: ProcessRef.from_instance_id(e["instanceId"]) for key, e in self.outputs["proxies"].items()
        }
        return {key: ref for key, ref in refs.items() if ref is not None}

    def get(self, name: str, *, creds_of: str | None = None) -> int:
        """GET the origin through proxy `name` with the credentials of `creds_of` (its own by default)."""
        endpoint = self.outputs["proxies"][f"crawl/{name}"]
        creds = self.outputs["credentials"][f"crawl/{creds_of or name}"]
        proxy = f"http://{creds['username']}:{creds['password']}@{endpoint['host']}:{endpoint['port']}"
        with httpx.Client(proxy=proxy, timeout=5) as client:
            return client.get(f"http://127.0.0.1:{self.origin_port}/").status_code


@pytest.fixture
def shared_stack(
    pulumi_env: PulumiEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[SharedStack]:
    monkeypatch.setenv(
        "PYTHONPATH", str(ROOT)
    )  # the dynamic provider unpickles stacks.programs.* by reference
    work = tmp_path / "work"
    work.mkdir()
    (work / "Pulumi.yaml").write_text(f"name: proxy-operator\nruntime: python\nmain: {ROOT / 'stacks'}\n")
    stack = auto.create_or_select_stack(stack_name="shared-test", work_dir=str(work))
    with serve_page(PAGE) as origin_port:
        made = SharedStack(stack, tmp_path / "s", origin_port)
        try:
            yield made
        finally:
            stack.destroy()
            for ref in made.seen:  # a failed destroy must not leave a process running
                proc.stop(ref, grace=1)


def _one_listener(stack: SharedStack) -> ProcessRef:
    refs = set(stack.instances().values())
    assert len(refs) == 1, refs
    [ref] = refs
    assert proc.is_running(ref)
    return ref


def test_one_listener_serves_edits_moves_removes_and_comes_back(shared_stack: SharedStack) -> None:
    s = shared_stack
    for name, reaches in (("alpha", True), ("beta", True), ("gamma", False)):
        s.add(name, reaches_origin=reaches)
    s.up()
    listener = _one_listener(s)
    assert (s.get("alpha"), s.get("beta")) == (200, 200)
    assert s.get("alpha", creds_of="beta") == 407  # each port takes its own credentials only
    assert s.get("gamma") == 403  # gamma's policy refuses loopback, the others' allow it

    s.proxies["gamma"]["spec"]["egress"] = s.proxies["alpha"]["spec"]["egress"]
    s.up()
    assert _one_listener(s) == listener  # edited in place, nobody restarted
    assert s.get("gamma") == 200

    old_port = s.outputs["proxies"]["crawl/beta"]["port"]
    s.proxies["beta"]["spec"]["port"] = free_port()
    s.up()
    assert _one_listener(s) == listener
    assert s.get("beta") == 200
    assert not proc.accepts_within("127.0.0.1", old_port, timeout=0.2)

    del s.proxies["alpha"]
    alpha_port = s.outputs["proxies"]["crawl/alpha"]["port"]
    s.up()
    assert not proc.accepts_within("127.0.0.1", alpha_port, timeout=0.2)
    assert (s.get("beta"), s.get("gamma")) == (200, 200)
    credentials = s.outputs["credentials"]

    os.kill(listener.pid, signal.SIGKILL)  # every proxy of the entry goes with it
    s.stack.refresh()
    resources = s.stack.export_stack().deployment.get("resources", [])
    assert not [r for r in resources if r["type"].endswith(":LocalProxy")]  # read reported each gone
    s.up()
    assert _one_listener(s) != listener
    assert s.outputs["credentials"] == credentials  # generated credentials live in state
    assert (s.get("beta"), s.get("gamma")) == (200, 200)


def test_switching_the_process_model_replaces_each_proxy(shared_stack: SharedStack) -> None:
    s = shared_stack
    s.add("alpha", reaches_origin=True)
    s.add("beta", reaches_origin=True)
    s.entry["processModel"] = "perProxy"
    s.up()
    own = s.instances()
    assert len(set(own.values())) == 2

    s.entry["processModel"] = "shared"
    s.up()
    listener = _one_listener(s)
    assert not any(proc.is_running(ref) for ref in own.values())  # stopped first: the port is reused
    assert (s.get("alpha"), s.get("beta")) == (200, 200)

    s.entry["processModel"] = "perProxy"
    s.up()
    assert len(set(s.instances().values())) == 2
    assert not proc.is_running(listener)  # its last proxy left
    assert (s.get("alpha"), s.get("beta")) == (200, 200)
