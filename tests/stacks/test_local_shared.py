"""`processModel: shared` below the engine: the shared listener's provider (`create`, `read`, `update`,
`delete` as the engine calls them) on real listener processes, a loopback site, and the lease users and
probe gate of the service against them."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.health.listener import refusal
from service.inventory import ProxyEndpoint
from stacks.forward_proxy import control
from stacks.forward_proxy.identity import ProcessRef
from stacks.models import ProviderCatalogue
from stacks.programs import local_process as proc
from stacks.programs.local_listener import SharedListener
from stacks.programs.local_shared import LocalSharedProxyProvider
from tests.ports import free_port
from tests.security.loopback_site import serve_page

PAGE = b"through the shared listener\n"


@pytest.fixture
def origin_port() -> Iterator[int]:
    with serve_page(PAGE) as port:
        yield port


def _props(state: Path, name: str, *, origin_port: int | None, **extra: Any) -> dict[str, Any]:
    allow = [{"cidr": "127.0.0.1/32", "ports": [origin_port]}] if origin_port else []
    return {
        "key": f"crawl/{name}",
        "stem": f"crawl_{name}",
        "state_dir": str(state),
        "bind_address": "127.0.0.1",
        "port": free_port(),
        "protocol": "http",
        "username": f"user-{name}",
        "password": f"pass-{name}",
        "egress": {"allow": allow},
        "sources": [],
        "process_model": "shared",
        "entry": "shared-test",
    } | extra


class Fleet:
    """Proxies created through the provider; whatever a test leaves is deleted, the listener stopped."""

    def __init__(self, state: Path) -> None:
        self.provider = LocalSharedProxyProvider()
        self.state = state
        self.outs: dict[str, dict[str, Any]] = {}
        self.listeners: set[ProcessRef] = set()  # every listener a create reported, stopped at the end

    def create(self, props: dict[str, Any]) -> dict[str, Any]:
        created = self.provider.create(props)
        assert created.outs is not None
        self.outs[props["key"]] = dict(created.outs)
        self.listeners.add(self.ref(props["key"]))
        return self.outs[props["key"]]

    def delete(self, key: str) -> None:
        self.provider.delete("id", self.outs.pop(key))

    def ref(self, key: str) -> ProcessRef:
        return ProcessRef(pid=self.outs[key]["pid"], start_time=self.outs[key]["start_time"])


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    made = Fleet(tmp_path / "state")
    try:
        yield made
    finally:
        try:
            for key in list(made.outs):
                made.delete(key)
        finally:  # also the listener of a test that failed after its last delete began
            for ref in made.listeners:
                proc.stop(ref, grace=1)


def _get(outs: dict[str, Any], origin_port: int, *, user: str, password: str) -> int:
    proxy = f"http://{user}:{password}@127.0.0.1:{outs['port']}"
    with httpx.Client(proxy=proxy, timeout=5) as client:
        return client.get(f"http://127.0.0.1:{origin_port}/").status_code


def _own(outs: dict[str, Any], origin_port: int) -> int:
    return _get(outs, origin_port, user=outs["username"], password=outs["password"])


def test_two_proxies_one_process_each_its_own_credentials_and_egress(
    fleet: Fleet, tmp_path: Path, origin_port: int
) -> None:
    a = fleet.create(_props(fleet.state, "a", origin_port=origin_port))
    b = fleet.create(_props(fleet.state, "b", origin_port=None))  # egress: public destinations only
    assert fleet.ref("crawl/a") == fleet.ref("crawl/b")
    assert _own(a, origin_port) == 200
    assert _get(a, origin_port, user=b["username"], password=b["password"]) == 407  # b's login on a
    assert _own(b, origin_port) == 403  # b's own policy refuses loopback; a's allows it
    assert "pass-a" not in Path(f"/proc/{a['pid']}/cmdline").read_text()
    assert oct((fleet.state / "crawl_a.json").stat().st_mode)[-3:] == "600"


def test_an_egress_edit_is_applied_in_place(fleet: Fleet, origin_port: int) -> None:
    olds = fleet.create(_props(fleet.state, "edit", origin_port=None))
    assert _own(olds, origin_port) == 403
    news = {**olds, "egress": {"allow": [{"cidr": "127.0.0.1/32", "ports": [origin_port]}]}}
    assert fleet.provider.diff("id", olds, news).replaces == []
    updated = fleet.provider.update("id", olds, news)
    assert updated.outs is not None
    fleet.outs["crawl/edit"] = dict(updated.outs)
    assert (updated.outs["pid"], updated.outs["start_time"]) == (olds["pid"], olds["start_time"])
    assert _own(updated.outs, origin_port) == 200


def test_diff_replaces_on_a_listener_or_process_model_change() -> None:
    olds = {"bind_address": "127.0.0.1", "port": 3128, "protocol": "http", "process_model": "shared"}
    provider = LocalSharedProxyProvider()
    for key, value in (("port", 3129), ("protocol", "socks5"), ("process_model", None)):
        result = provider.diff("id", olds, {**olds, key: value})
        assert (result.replaces, result.delete_before_replace) == ([key], True)


def test_delete_drops_one_port_and_the_last_stops_the_listener(fleet: Fleet, origin_port: int) -> None:
    a = fleet.create(_props(fleet.state, "a", origin_port=origin_port))
    b = fleet.create(_props(fleet.state, "b", origin_port=origin_port))
    ref = fleet.ref("crawl/a")
    fleet.delete("crawl/a")
    with pytest.raises(httpx.ConnectError):
        _own(a, origin_port)
    assert _own(b, origin_port) == 200
    assert not (fleet.state / "crawl_a.json").exists()
    fleet.delete("crawl/b")
    assert not proc.is_running(ref)


def test_read_reports_gone_when_the_listener_died_was_replaced_or_dropped_the_port(
    fleet: Fleet, origin_port: int
) -> None:
    a = fleet.create(_props(fleet.state, "a", origin_port=origin_port))
    b = fleet.create(_props(fleet.state, "b", origin_port=origin_port))
    provider = fleet.provider
    assert provider.read("id", a).id == "id"
    assert provider.read("id", {**a, "start_time": a["start_time"] + 1}).id == ""  # its pid reused
    me = {**a, "pid": os.getpid(), "start_time": proc.start_time(os.getpid())}
    assert provider.read("id", me).id == ""  # another program
    assert provider.read("id", {**a, "port": b["port"]}).id == ""  # not on that port
    listener = SharedListener(fleet.state, "shared-test")
    listener.call({"op": "drop", "proxy": "crawl/b"})
    assert provider.read("id", b).id == ""
    os.kill(a["pid"], signal.SIGKILL)
    assert provider.read("id", a).id == ""


def test_a_crashed_listener_takes_every_proxy_down_and_a_create_starts_a_new_one(
    fleet: Fleet, origin_port: int
) -> None:
    props = [_props(fleet.state, name, origin_port=origin_port) for name in ("a", "b")]
    for item in props:
        fleet.create(item)
    old = fleet.ref("crawl/a")
    os.kill(old.pid, signal.SIGKILL)
    for item in props:  # what `up` does once a refresh found them gone
        assert fleet.provider.read("id", fleet.outs[item["key"]]).id == ""
        fleet.create(item)
    new = fleet.ref("crawl/a")
    assert new != old
    assert new == fleet.ref("crawl/b")
    assert _own(fleet.outs["crawl/b"], origin_port) == 200


def test_a_create_again_adopts_the_port_it_already_serves(fleet: Fleet, origin_port: int) -> None:
    """An interrupted create (the service killed mid-`up`) left the port served: the next one takes it."""
    props = _props(fleet.state, "again", origin_port=origin_port)
    first = fleet.create(props)
    second = fleet.create(props)
    assert (first["pid"], first["start_time"]) == (second["pid"], second["start_time"])
    assert _own(second, origin_port) == 200


def test_lease_users_are_each_proxys_own(
    fleet: Fleet, origin_port: int, current_event_loop: asyncio.AbstractEventLoop
) -> None:
    run = current_event_loop.run_until_complete  # asyncio.run would leave this suite's loop unclosed
    a = fleet.create(_props(fleet.state, "a", origin_port=origin_port))
    b = fleet.create(_props(fleet.state, "b", origin_port=origin_port))
    assert a["control"].startswith("shared:crawl/a@")
    add = {"op": "add", "user": "lease-1", "password": "leased-secret", "ttl": 60}
    run(control.call(a["control"], add, wait=2))
    assert _get(a, origin_port, user="lease-1", password="leased-secret") == 200
    assert _get(b, origin_port, user="lease-1", password="leased-secret") == 407
    run(control.call(a["control"], {"op": "revoke", "user": "lease-1"}, wait=2))
    assert _get(a, origin_port, user="lease-1", password="leased-secret") == 407


def test_the_probe_gate_admits_a_served_port_and_refuses_a_dropped_one(
    fleet: Fleet, origin_port: int
) -> None:
    a = fleet.create(_props(fleet.state, "a", origin_port=origin_port))
    b = fleet.create(_props(fleet.state, "b", origin_port=origin_port))

    def endpoint(outs: dict[str, Any]) -> ProxyEndpoint:
        key = outs["key"]
        instance = f"{outs['pid']}-{outs['start_time']}"
        return ProxyEndpoint(
            key=key, namespace="crawl", name=key, provider="p", host="127.0.0.1", port=outs["port"],
            instance_id=instance, local=True,
        )  # fmt: skip

    assert refusal(endpoint(a)) is None
    assert refusal(endpoint(b)) is None  # remembered now: the next check reads one descriptor
    fleet.delete("crawl/b")
    with socket.socket() as squatter:  # another process takes the port b's listener let go
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", b["port"]))
        squatter.listen()
        assert "does not listen on port" in str(refusal(endpoint(b)))
    assert refusal(endpoint(a)) is None


def test_process_model_is_validated_with_a_clear_error() -> None:
    entry = {"name": "local", "type": "local", "processModel": "shared"}
    assert ProviderCatalogue.model_validate({"providers": [entry]}).providers[0].process_model == "shared"
    default = ProviderCatalogue.model_validate({"providers": [{"name": "l", "type": "local"}]})
    assert default.providers[0].process_model == "perProxy"
    with pytest.raises(ValueError, match=r"use perProxy .* or shared"):
        ProviderCatalogue.model_validate({"providers": [{**entry, "processModel": "one"}]})
