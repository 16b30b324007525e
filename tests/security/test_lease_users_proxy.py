"""The forward proxy's per-lease users, on real `local` proxy processes (started by the provider's create).

Users are added, renewed and revoked at run time over the control socket, without a restart or Pulumi; a
user stops working at its end on its own (a lost revoke cannot keep access alive); the static credentials
keep working beside them; only the proxy's owner can reach the socket. Each test fails on the code before
lease-scoped credentials, where the proxy knew one user and had no control channel.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stacks.forward_proxy import control
from stacks.programs.local import LocalProxyProvider
from tests.ports import free_port
from tests.security.loopback_site import serve_page

PAGE = b"through the proxy\n"


@pytest.fixture
def site() -> Iterator[int]:
    with serve_page(PAGE) as port:
        yield port


Start = Callable[..., dict[str, Any]]


@pytest.fixture
def start(tmp_path: Path, site: int) -> Iterator[Start]:
    """A proxy allowing the site, through the provider's create; returns its outputs. All deleted after."""
    provider, started = LocalProxyProvider(), []

    def run(*, protocol: str = "http", username: str | None = "crawler") -> dict[str, Any]:
        port = free_port()
        props = {"state_dir": str(tmp_path), "stem": f"p{port}", "bind_address": "127.0.0.1", "port": port}
        props |= {"protocol": protocol, "username": username, "password": "Pass1234" if username else None}
        props["egress"] = {"allow": [{"cidr": "127.0.0.1/32", "ports": [site]}]}
        created = provider.create(props)
        started.append(created)
        return dict(created.outs)

    yield run
    for created in started:
        provider.delete(created.id, created.outs)


def send(path: str, **request: Any) -> None:
    asyncio.run(control.call(path, request, wait=5))


def fetch(proxy: dict[str, Any], site: int, user: str, password: str) -> int:
    url = f"http://{user}:{password}@127.0.0.1:{proxy['port']}"
    with httpx.Client(proxy=url, timeout=10) as client:
        return client.get(f"http://127.0.0.1:{site}/").status_code


def socks_login(proxy: dict[str, Any], user: str, password: str) -> int:
    """RFC 1929 status of a SOCKS5 user/password login: 0 admitted."""
    with socket.create_connection(("127.0.0.1", proxy["port"]), timeout=5) as sock:
        sock.sendall(b"\x05\x01\x02")
        assert sock.recv(2) == b"\x05\x02"
        sock.sendall(bytes([1, len(user)]) + user.encode() + bytes([len(password)]) + password.encode())
        return sock.recv(2)[1]


def until(condition: Callable[[], bool], *, within: float = 20.0) -> bool:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_the_control_socket_is_the_owners_alone(start: Start, tmp_path: Path) -> None:
    proxy = start()
    path = Path(proxy["control"])
    assert path.parent == tmp_path
    assert stat.S_ISSOCK(path.stat().st_mode)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # no other local user may connect
    assert stat.S_IMODE(tmp_path.stat().st_mode) & 0o077 == 0


def test_a_user_added_at_run_time_works_until_revoked_and_the_static_one_stays(
    start: Start, site: int
) -> None:
    proxy = start()
    assert fetch(proxy, site, "lease-1", "s3cret-1") == 407
    send(proxy["control"], op="add", user="lease-1", password="s3cret-1", ttl=300)
    assert fetch(proxy, site, "lease-1", "s3cret-1") == 200
    assert fetch(proxy, site, "lease-1", "wrong") == 407
    send(proxy["control"], op="revoke", user="lease-1")
    assert fetch(proxy, site, "lease-1", "s3cret-1") == 407
    send(proxy["control"], op="revoke", user="lease-1")  # idempotent: a retried revoke is no error
    assert fetch(proxy, site, "crawler", "Pass1234") == 200  # the prober's and operators' credentials


def test_a_user_ends_on_its_own_and_a_renewal_moves_its_end(start: Start, site: int) -> None:
    proxy = start()
    send(proxy["control"], op="add", user="short", password="pw-short", ttl=2)
    send(proxy["control"], op="add", user="renewed", password="pw-renewed", ttl=2)
    send(proxy["control"], op="renew", user="renewed", ttl=300)
    assert fetch(proxy, site, "short", "pw-short") == 200
    assert until(lambda: fetch(proxy, site, "short", "pw-short") == 407)  # no revoke was sent
    assert fetch(proxy, site, "renewed", "pw-renewed") == 200
    with pytest.raises(control.ControlError, match="unknown or ended"):
        send(proxy["control"], op="renew", user="short", ttl=300)  # an ended user cannot be revived


def test_socks5_admits_a_lease_user_until_revoked(start: Start) -> None:
    proxy = start(protocol="socks5")
    assert socks_login(proxy, "lease-2", "s3cret-2") != 0
    send(proxy["control"], op="add", user="lease-2", password="s3cret-2", ttl=300)
    assert socks_login(proxy, "lease-2", "s3cret-2") == 0
    send(proxy["control"], op="revoke", user="lease-2")
    assert socks_login(proxy, "lease-2", "s3cret-2") != 0
    assert socks_login(proxy, "crawler", "Pass1234") == 0


@pytest.mark.parametrize(
    "request_",
    [
        {"op": "add", "user": "a:b", "password": "x", "ttl": 5},  # Basic auth could not carry it
        {"op": "add", "user": "u", "password": "x", "ttl": 0},
        {"op": "add", "user": "u", "password": "", "ttl": 5},
        {"op": "drop-all"},
        {"op": "add", "user": "u", "password": "x", "digest": "00" * 32, "ttl": 5},  # which one?
        {"op": "add", "user": "u", "digest": "ab", "ttl": 5},  # not a SHA-256
        {"op": "add", "user": "u", "digest": "zz" * 32, "ttl": 5},  # not hex
    ],
)
def test_a_malformed_request_is_refused(start: Start, request_: dict[str, Any]) -> None:
    proxy = start()
    with pytest.raises(control.ControlError):
        send(proxy["control"], **request_)


def test_a_user_added_by_its_digest_logs_in_with_its_password_and_hello_names_the_process(
    start: Start, site: int
) -> None:
    """What the service sends a proxy started again (a new pod, a restart): the user by the SHA-256 of its
    password, which the service keeps instead of the password; `hello` tells one process from another."""
    first, second = start(), start()
    digest = hashlib.sha256(b"s3cret-9").hexdigest()
    send(first["control"], op="add", user="lease-9", digest=digest, ttl=300)
    assert fetch(first, site, "lease-9", "s3cret-9") == 200
    assert fetch(first, site, "lease-9", digest) == 407  # the digest itself is no password
    hello = [asyncio.run(control.call(p["control"], {"op": "hello"}, wait=5)) for p in (first, first, second)]
    assert hello[0] == hello[1]
    assert hello[0]["instance"] != hello[2]["instance"]


def test_a_proxy_without_credentials_has_no_control_channel(start: Start, tmp_path: Path) -> None:
    proxy = start(username=None)  # loopback only (the model's rule): nothing to scope
    assert proxy["control"] is None
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".ctl"]


def test_the_socket_is_removed_when_the_proxy_stops(start: Start) -> None:
    proxy = start()
    os.kill(int(proxy["pid"]), 15)
    assert until(lambda: not Path(proxy["control"]).exists())
