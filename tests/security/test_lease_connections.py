"""Open connections follow their lease user, on real `local` proxy processes (the provider's create).

A connection authenticated as a lease user (CONNECT, a plain-HTTP request in the middle of its body, SOCKS5)
is cut when the user is revoked and when its end passes without a renewal, on both sides: the client sees
the close within a second and the site (a loopback echo server) receives nothing more. A renewal moves the
end; connections on the static credentials stream on through all of it. Each test fails on the code
before, where a user's end and its revoke only stopped new logins: open tunnels relayed on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stacks.forward_proxy import control
from stacks.programs.local import LocalProxyProvider
from tests.ports import free_port
from tests.security.loopback_echo import Echo, serve_echo
from tests.security.tunnels import (
    Opener,
    Tunnel,
    connect_tunnel,
    forward_request,
    socks_tunnel,
    stream,
    until,
)

STATIC = ("crawler", "Pass1234")
CUT_WITHIN = 1.0  # the behavioural bound: a revoke or an end reaches open connections within a second
OPENERS: dict[str, tuple[str, Opener]] = {
    "connect": ("http", connect_tunnel),
    "forward": ("http", forward_request),
    "socks5": ("socks5", socks_tunnel),
}


@pytest.fixture
def echo() -> Iterator[Echo]:
    with serve_echo() as server:
        yield server


Start = Callable[..., dict[str, Any]]


@pytest.fixture
def start(tmp_path: Path, echo: Echo) -> Iterator[Start]:
    """A proxy allowing the echo server, through the provider's create; its outputs. Deleted after."""
    provider, started = LocalProxyProvider(), []

    def run(*, protocol: str = "http") -> dict[str, Any]:
        port = free_port()
        props = {"state_dir": str(tmp_path), "stem": f"p{port}", "bind_address": "127.0.0.1", "port": port}
        props |= {"protocol": protocol, "username": STATIC[0], "password": STATIC[1]}
        props["egress"] = {"allow": [{"cidr": "127.0.0.1/32", "ports": [echo.port]}]}
        created = provider.create(props)
        started.append(created)
        return dict(created.outs)

    yield run
    for created in started:
        provider.delete(created.id, created.outs)


@pytest.fixture
def kept() -> Iterator[Callable[[Tunnel], Tunnel]]:
    """`kept(tunnel)`: closed at the end of the test."""
    opened: list[Tunnel] = []

    def keep(tunnel: Tunnel) -> Tunnel:
        opened.append(tunnel)
        return tunnel

    yield keep
    for tunnel in opened:
        tunnel.close()


Kept = Callable[[Tunnel], Tunnel]


def send(proxy: dict[str, Any], **request: Any) -> None:
    asyncio.run(control.call(proxy["control"], request, wait=5))


def _cut_on_both_sides(tunnel: Tunnel, echo: Echo, index: int) -> None:
    """The proxy closed the site's side too, and nothing the client sends after the cut arrives there."""
    line = echo.line(index)
    assert until(lambda: line.closed_at is not None, within=CUT_WITHIN)
    at_cut = line.received
    tunnel.keep_sending(0.3)
    assert line.received == at_cut
    assert tunnel.echoed <= at_cut - tunnel.head <= tunnel.sent


@pytest.mark.parametrize("kind", OPENERS)
def test_a_revoke_cuts_the_users_open_connections_and_not_the_static_ones(
    start: Start, echo: Echo, kept: Kept, kind: str
) -> None:
    protocol, open_ = OPENERS[kind]
    proxy = start(protocol=protocol)
    send(proxy, op="add", user="lease-a", password="pw-a", ttl=300)
    leased = kept(open_(proxy["port"], echo.port, "lease-a", "pw-a"))
    static = kept(open_(proxy["port"], echo.port, *STATIC))
    assert stream([leased, static], watch=leased, within=0.5) is None  # both stream

    revoked = time.monotonic()
    send(proxy, op="revoke", user="lease-a")
    cut = stream([leased, static], watch=leased, within=3.0)

    assert cut is not None, "the revoked user's connection still relays"
    assert cut - revoked < CUT_WITHIN
    _cut_on_both_sides(leased, echo, 0)
    assert stream([static], watch=static, within=0.5) is None
    assert echo.line(1).closed_at is None


def test_a_users_end_cuts_its_connections_and_a_renewal_moves_the_end(
    start: Start, echo: Echo, kept: Kept
) -> None:
    proxy = start()
    before = time.monotonic()
    send(proxy, op="add", user="short", password="pw-short", ttl=2)
    send(proxy, op="add", user="renewed", password="pw-renewed", ttl=2)
    after = time.monotonic()
    short = kept(connect_tunnel(proxy["port"], echo.port, "short", "pw-short"))
    renewed = kept(connect_tunnel(proxy["port"], echo.port, "renewed", "pw-renewed"))
    static = kept(connect_tunnel(proxy["port"], echo.port, *STATIC))
    send(proxy, op="renew", user="renewed", ttl=60)

    cut = stream([short, renewed, static], watch=short, within=5.0)  # no revoke is sent

    assert cut is not None, "the ended user's connection still relays"
    assert before + 2 - 0.05 <= cut <= after + 2 + CUT_WITHIN
    _cut_on_both_sides(short, echo, 0)
    assert stream([renewed, static], watch=renewed, within=1.5) is None  # well past the first end
