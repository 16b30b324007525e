"""The `local` provider type through the real Pulumi engine, with real proxy processes on loopback.

`up` starts a proxy that the test uses, with the stack's credentials, to fetch a page from a loopback HTTP
server (and is refused without them); `destroy` stops it; a killed process comes back with `refresh` + `up`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pulumi import automation as auto

from stacks.programs import local_process as proc
from stacks.programs.local import LocalProxyProvider
from tests.conftest import ROOT, PulumiEnv
from tests.ports import free_port
from tests.security.loopback_site import serve_page

PAGE = b"hello through the proxy\n"
KEY = "crawl/alpha"


@pytest.fixture
def origin() -> Iterator[str]:
    with serve_page(PAGE) as port:
        yield f"http://127.0.0.1:{port}/"


def allow_origin(origin: str) -> dict[str, object]:
    """spec.egress allowing the loopback test site explicitly (the default refuses loopback)."""
    return {"allow": [{"cidr": "127.0.0.1/32", "ports": [int(origin.rsplit(":", 1)[1].strip("/"))]}]}


def _refs(stack: auto.Stack) -> list[proc.ProcessRef]:
    resources = stack.export_stack().deployment.get("resources", [])
    outputs = [r.get("outputs", {}) for r in resources if r["type"].endswith(":LocalProxy")]
    return [proc.ProcessRef(pid=o["pid"], start_time=o["start_time"]) for o in outputs if o.get("pid")]


@pytest.fixture
def local_stack(
    pulumi_env: PulumiEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin: str
) -> Iterator[auto.Stack]:
    # The dynamic provider process runs in stacks/ and unpickles stacks.programs.local by reference: the
    # editable install of `make install` makes it importable, PYTHONPATH covers a venv without it.
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    work = tmp_path / "work"
    work.mkdir()
    (work / "Pulumi.yaml").write_text(f"name: proxy-operator\nruntime: python\nmain: {ROOT / 'stacks'}\n")
    stack = auto.create_or_select_stack(stack_name="local-test", work_dir=str(work))
    entry = {"name": "local-test", "type": "local", "stateDir": str(tmp_path / "state")}
    proxy = {
        "namespace": "crawl",
        "name": "alpha",
        "labels": {},
        "spec": {"provider": "local-test", "port": free_port(), "egress": allow_origin(origin)},
    }
    stack.set_config("proxy-operator:provider", auto.ConfigValue(json.dumps(entry)))
    stack.set_config("proxy-operator:proxies", auto.ConfigValue(json.dumps([proxy])))
    stack.set_config("proxy-operator:specHash", auto.ConfigValue("hash-of-this-spec"))
    try:
        yield stack
    finally:
        leftovers = _refs(stack)
        stack.destroy()
        for ref in leftovers:  # a failed destroy must not leave a proxy running
            proc.stop(ref, grace=1)


def _fetch(url: str, *, proxy: str) -> httpx.Response:
    with httpx.Client(proxy=proxy, timeout=5) as client:
        return client.get(url)


def _proxy_urls(up: auto.UpResult) -> tuple[str, str]:
    endpoint = up.outputs["proxies"].value[KEY]
    creds = up.outputs["credentials"].value[KEY]
    plain = f"http://{endpoint['host']}:{endpoint['port']}"
    return plain, plain.replace("://", f"://{creds['username']}:{creds['password']}@")


@pytest.mark.engine
def test_up_serves_with_credentials_and_destroy_stops(local_stack: auto.Stack, origin: str) -> None:
    up = local_stack.up()
    assert up.outputs["credentials"].secret
    assert up.outputs["specHash"].value == "hash-of-this-spec"
    plain, authed = _proxy_urls(up)

    response = _fetch(origin, proxy=authed)
    assert (response.status_code, response.content) == (200, PAGE)
    assert _fetch(origin, proxy=plain).status_code == 407
    # A second anonymous try is refused too: the proxy must not trust the address after one good login.
    assert _fetch(origin, proxy=plain).status_code == 407

    [ref] = _refs(local_stack)
    local_stack.destroy()
    assert not proc.is_running(ref)
    with pytest.raises(httpx.ConnectError):
        _fetch(origin, proxy=authed)


@pytest.mark.engine
def test_killed_process_comes_back_with_refresh_and_up(local_stack: auto.Stack, origin: str) -> None:
    first = local_stack.up()
    [before] = _refs(local_stack)
    os.kill(before.pid, signal.SIGKILL)

    local_stack.refresh()
    assert _refs(local_stack) == []  # read reported it gone
    second = local_stack.up()

    [after] = _refs(local_stack)
    assert after != before
    assert proc.is_running(after)
    # Generated credentials live in state, so the new process takes the same ones.
    assert second.outputs["credentials"].value == first.outputs["credentials"].value
    _, authed = _proxy_urls(second)
    assert _fetch(origin, proxy=authed).status_code == 200


def test_read_reports_a_reused_pid_as_gone(tmp_path: Path) -> None:
    props = {
        "state_dir": str(tmp_path),
        "stem": "crawl_read",
        "bind_address": "127.0.0.1",
        "port": free_port(),
    }
    provider = LocalProxyProvider()
    created = provider.create({**props, "protocol": "http", "username": None})
    try:
        assert provider.read(created.id, created.outs).id == created.id
        # Same pid, other start time: a different process now owns the pid.
        later = {**created.outs, "start_time": created.outs["start_time"] + 1}
        assert provider.read(created.id, later).id == ""
    finally:
        provider.delete(created.id, created.outs)
    # A live process with the recorded pid and start time that is not our proxy (after a reboot, another
    # program can get both): gone too, so a refresh drops it and `up` starts the proxy again.
    me = {"pid": os.getpid(), "start_time": proc.start_time(os.getpid())}
    assert provider.read("x", me).id == ""


def test_diff_replaces_on_a_listener_change_and_edits_the_rest_in_place() -> None:
    """Before: an egress, sources or credentials edit replaced the process (every tunnel and lease user
    of the stack's proxies lost at once)."""
    olds = {"bind_address": "127.0.0.1", "port": 3128, "protocol": "http", "username": "u", "password": "p"}
    provider = LocalProxyProvider()
    assert provider.diff("x", olds, dict(olds)).changes is False
    listener = (("port", 3129), ("protocol", "socks5"), ("bind_address", "0.0.0.0"), ("username", None))
    for key, value in listener:
        result = provider.diff("x", olds, {**olds, key: value})
        assert result.replaces == [key]
        assert result.delete_before_replace
    for key, value in (
        ("password", "q"),
        ("username", "v"),
        ("egress", {"allowPorts": [80, 443, 8080]}),
        ("sources", ["10.0.0.0/8"]),
    ):
        result = provider.diff("x", olds, {**olds, key: value})
        assert (result.changes, result.replaces) == (True, []), key


def test_start_failure_names_the_cause(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        props = {"state_dir": str(tmp_path), "stem": "busy", "bind_address": "127.0.0.1", "port": port}
        with pytest.raises(proc.ProxyStartError, match="exited before listening"):
            LocalProxyProvider().create({**props, "protocol": "http", "username": None})


def _socks5_get(proxy_port: int, origin: str, *, username: str, password: str) -> bytes:
    """A minimal SOCKS5 client (RFC 1928/1929): user/pass auth, CONNECT, then one HTTP GET."""
    origin_port = int(origin.rsplit(":", 1)[1].strip("/"))
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=5) as sock:
        sock.sendall(b"\x05\x01\x02")
        assert sock.recv(2) == b"\x05\x02"
        user, secret = username.encode(), password.encode()
        sock.sendall(b"\x01" + bytes([len(user)]) + user + bytes([len(secret)]) + secret)
        if sock.recv(2) != b"\x01\x00":
            return b""
        sock.sendall(b"\x05\x01\x00\x01" + socket.inet_aton("127.0.0.1") + origin_port.to_bytes(2, "big"))
        assert sock.recv(10)[:2] == b"\x05\x00"
        sock.sendall(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
        return b"".join(chunks)


def test_socks5_process_authenticates_and_delete_stops_it(tmp_path: Path, origin: str) -> None:
    port = free_port()
    props = {"state_dir": str(tmp_path), "stem": "crawl_socks", "bind_address": "127.0.0.1", "port": port}
    props |= {
        "protocol": "socks5",
        "username": "crawler",
        "password": "Sock5Pass",
        "egress": allow_origin(origin),
    }
    provider = LocalProxyProvider()
    created = provider.create(props)
    ref = proc.ProcessRef(pid=created.outs["pid"], start_time=created.outs["start_time"])
    try:
        assert _socks5_get(port, origin, username="crawler", password="Sock5Pass").endswith(PAGE)
        assert _socks5_get(port, origin, username="crawler", password="wrong") == b""
        assert "Sock5Pass" not in Path(f"/proc/{ref.pid}/cmdline").read_text()  # read from a 0600 file
    finally:
        provider.delete(created.id, created.outs)
    assert not proc.is_running(ref)
    assert not (tmp_path / "crawl_socks.json").exists()


def test_a_create_cut_short_leaves_no_process_in_the_way(tmp_path: Path, origin: str) -> None:
    """The fault campaign's finding: the service SIGKILLed during an `up` left the proxy its create had
    started (the engine held a pending create with no pid); every later create of it failed with
    EADDRINUSE and the stack stayed stuck. Now the next create stops that orphan first."""
    port = free_port()
    props = {"state_dir": str(tmp_path), "stem": "crawl_cut", "bind_address": "127.0.0.1", "port": port}
    props |= {"protocol": "http", "username": None, "egress": allow_origin(origin)}
    provider = LocalProxyProvider()
    first = provider.create(props)  # stands for the interrupted one: its process runs, the engine forgot it
    orphan = proc.ProcessRef(pid=first.outs["pid"], start_time=first.outs["start_time"])
    (tmp_path / "crawl_cut.starting").write_text(
        json.dumps({"pid": orphan.pid, "start_time": orphan.start_time})
    )
    second = provider.create(props)
    try:
        assert not proc.is_running(orphan), "the orphan of the interrupted create still runs"
        assert proc.is_running(proc.ProcessRef(pid=second.outs["pid"], start_time=second.outs["start_time"]))
        assert not (tmp_path / "crawl_cut.starting").exists()
    finally:
        provider.delete(second.id, second.outs)


def test_a_forgotten_proxy_is_not_stopped_by_a_new_create(tmp_path: Path, origin: str) -> None:
    """A finished create leaves no trace: a forgotten (skip-cleanup) process is never taken for an orphan."""
    port = free_port()
    props = {"state_dir": str(tmp_path), "stem": "crawl_kept", "bind_address": "127.0.0.1", "port": port}
    props |= {"protocol": "http", "username": None, "egress": allow_origin(origin)}
    provider = LocalProxyProvider()
    kept = provider.create(props)
    ref = proc.ProcessRef(pid=kept.outs["pid"], start_time=kept.outs["start_time"])
    try:
        with pytest.raises(proc.ProxyStartError):
            provider.create(props)  # its port is taken by the forgotten one: refused, not stolen
        assert proc.is_running(ref)
    finally:
        proc.stop(ref)
