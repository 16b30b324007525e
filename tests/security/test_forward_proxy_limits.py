"""The forward proxy's limits, on real proxy processes with short settings in their config file.

Nobody inside `allowedSourceRanges` can hold the proxy's file descriptors without authenticating: a request
head (HTTP) and a SOCKS5 handshake have a deadline, a relay with no byte either way for its idle limit is
closed on both sides, and one source address gets so many connections at once (the whole proxy, too), past
which a new one is answered 429 (503 for the whole) and closed. A port outside 1..65535 is a 400 (SOCKS5:
general failure), never a silent close. Each test fails on the code before, which had none of these limits
and let an OverflowError end `CONNECT host:99999` without an answer.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.loopback_echo import Echo, serve_echo
from tests.security.tunnels import (
    Tunnel,
    basic,
    closed,
    connect_tunnel,
    read_head,
    run_proxy,
    socks_connect,
    socks_login,
    socks_tunnel,
    stream,
    until,
)

STATIC = ("crawler", "Pass1234")
SILENT = 200
MARGIN = 2.0  # past a 1 s deadline: room for a loaded machine, far below the old behaviour (never)


@pytest.fixture
def echo() -> Iterator[Echo]:
    with serve_echo() as server:
        yield server


def _allow(echo: Echo) -> dict[str, object]:
    return {"allow": [{"cidr": "127.0.0.1/32", "ports": [echo.port]}]}


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    """Client sockets the test opens; all closed at the end."""
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def _open(port: int, opened: list[socket.socket], *, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    opened.append(sock)
    return sock


def _all_closed(socks: list[socket.socket], *, within: float) -> int:
    """How many of `socks` the proxy closed before `within` seconds from now ran out."""
    deadline = time.monotonic() + within
    return sum(closed(sock, within=max(0.01, deadline - time.monotonic())) for sock in socks)


def test_silent_clients_are_closed_at_the_head_deadline_while_a_real_one_is_served(
    tmp_path: Path, echo: Echo, sockets: list[socket.socket]
) -> None:
    with run_proxy(tmp_path, limits={"head_seconds": 1}, egress=_allow(echo)) as port:
        silent = [_open(port, sockets) for _ in range(SILENT)]
        partial = _open(port, sockets)
        partial.sendall(f"CONNECT 127.0.0.1:{echo.port} HTTP/1.1\r\n".encode())  # a head never finished
        opened = time.monotonic()
        tunnel = connect_tunnel(port, echo.port, *STATIC)  # while the 200 are open
        sockets.append(tunnel.sock)
        assert stream([tunnel], watch=tunnel, within=0.3) is None

        assert _all_closed([*silent, partial], within=1 + MARGIN) == SILENT + 1
        assert time.monotonic() - opened > 0.9  # closed by the deadline, not at once
        assert tunnel.ping()  # a relay is past its head: the deadline is not for it


def test_a_head_dripped_a_byte_at_a_time_is_closed_at_the_deadline(tmp_path: Path) -> None:
    with (
        run_proxy(tmp_path, limits={"head_seconds": 1}) as port,
        socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
    ):
        opened = time.monotonic()
        sock.sendall(b"CONNECT 127.0.0.1:443 HTTP/1.1\r\nX-Slow: ")
        while time.monotonic() - opened < 1 + MARGIN:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(b"a")  # a byte every 0.1 s: never idle, never done
            if closed(sock, within=0.1):
                break
        assert 0.9 < time.monotonic() - opened < 1 + MARGIN


def test_silent_and_stalled_socks_clients_are_closed_at_the_handshake_deadline(
    tmp_path: Path, echo: Echo, sockets: list[socket.socket]
) -> None:
    with run_proxy(tmp_path, protocol="socks5", limits={"handshake_seconds": 1}, egress=_allow(echo)) as port:
        silent = [_open(port, sockets) for _ in range(SILENT)]
        greeted = _open(port, sockets)
        greeted.sendall(b"\x05\x01\x02")  # a greeting, never a login
        logged_in = _open(port, sockets)
        socks_login(logged_in, *STATIC)  # a login, never a request
        tunnel = socks_tunnel(port, echo.port, *STATIC)  # while the others are open
        sockets.append(tunnel.sock)
        assert stream([tunnel], watch=tunnel, within=0.3) is None

        assert _all_closed([*silent, greeted, logged_in], within=1 + MARGIN) == SILENT + 2
        assert tunnel.ping()


def test_a_relay_idle_past_its_limit_is_closed_on_both_sides(
    tmp_path: Path, echo: Echo, sockets: list[socket.socket]
) -> None:
    with run_proxy(tmp_path, limits={"idle_seconds": 1}, egress=_allow(echo)) as port:
        tunnel = connect_tunnel(port, echo.port, *STATIC)
        sockets.append(tunnel.sock)
        assert stream([tunnel], watch=tunnel, within=2.5) is None  # busy: lives past the limit
        quiet = time.monotonic()

        assert closed(tunnel.sock, within=1 + MARGIN)
        assert time.monotonic() - quiet > 0.9
        assert until(lambda: echo.line(0).closed_at is not None, within=1.0)


def _occupy(port: int, echo: Echo, opened: list[socket.socket], *, source: str) -> Tunnel:
    """A working tunnel from `source`, retried for a while: a connection closed a moment ago (the start's
    probe, a tunnel the test just closed) counts until the proxy has seen it close."""
    request = f"CONNECT 127.0.0.1:{echo.port} HTTP/1.1\r\nProxy-Authorization: Basic {basic(*STATIC)}\r\n\r\n"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        sock = _open(port, opened, source=source)
        sock.sendall(request.encode())
        try:
            if read_head(sock).startswith(b"HTTP/1.1 200"):
                return Tunnel(sock)
        except ConnectionError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"no tunnel from {source}")


def _refused(port: int, *, source: str) -> bytes:
    """What a new connection from `source` is answered before the proxy closes it (b"" if held open)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) as sock:
        sock.settimeout(2)
        answer = b""
        try:
            while data := sock.recv(4096):
                answer += data
        except TimeoutError:
            return b""  # held open: not refused
        except ConnectionResetError:
            pass
        return answer


def test_one_source_gets_at_most_its_cap_of_connections(
    tmp_path: Path, echo: Echo, sockets: list[socket.socket]
) -> None:
    with run_proxy(tmp_path, limits={"per_source": 5}, egress=_allow(echo)) as port:
        full = [_occupy(port, echo, sockets, source="127.0.0.2") for _ in range(5)]
        assert all(tunnel.ping() for tunnel in full)

        answer = _refused(port, source="127.0.0.2")
        assert answer.startswith(b"HTTP/1.1 429 "), answer
        assert b"connection_limit_reached" in answer
        other = _occupy(port, echo, sockets, source="127.0.0.3")  # another source is not held back
        assert other.ping()
        full.pop().close()
        again = _occupy(port, echo, sockets, source="127.0.0.2")  # one closed: one more may come
        assert again.ping()


def test_the_whole_proxy_gets_at_most_its_cap_of_connections(
    tmp_path: Path, echo: Echo, sockets: list[socket.socket]
) -> None:
    with run_proxy(tmp_path, limits={"total": 3}, egress=_allow(echo)) as port:
        full = [_occupy(port, echo, sockets, source=f"127.0.0.{i}") for i in (2, 3, 4)]
        assert all(tunnel.ping() for tunnel in full)

        answer = _refused(port, source="127.0.0.5")
        assert answer.startswith(b"HTTP/1.1 503 "), answer


@pytest.fixture(scope="module")
def wide_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """An HTTP proxy that allows every port of loopback (so a bad port is never the policy's refusal)."""
    with run_proxy(tmp_path_factory.mktemp("wide"), egress={"allow": [{"cidr": "127.0.0.1/32"}]}) as port:
        yield port


def _status(port: int, request: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(f"{request}\r\nProxy-Authorization: Basic {basic(*STATIC)}\r\n\r\n".encode())
        return read_head(sock).split(b"\r\n", 1)[0]


BAD_AUTHORITIES = ["127.0.0.1:99999", "127.0.0.1:65536", "127.0.0.1:0", "127.0.0.1:abc", "127.0.0.1:-1"]
BAD_AUTHORITIES += ["127.0.0.1:+80", "127.0.0.1:8_0", "127.0.0.1:", "[::1]:99999", ":80"]


@pytest.mark.parametrize("authority", BAD_AUTHORITIES)
def test_a_connect_to_a_bad_port_is_a_400(wide_proxy: int, authority: str) -> None:
    assert _status(wide_proxy, f"CONNECT {authority} HTTP/1.1") == b"HTTP/1.1 400 Bad Request"


@pytest.mark.parametrize("authority", BAD_AUTHORITIES)
def test_a_request_to_a_bad_port_is_a_400(wide_proxy: int, authority: str) -> None:
    assert _status(wide_proxy, f"GET http://{authority}/ HTTP/1.1") == b"HTTP/1.1 400 Bad Request"


def test_a_socks_request_for_port_0_is_a_general_failure(tmp_path: Path) -> None:
    with (
        run_proxy(tmp_path, protocol="socks5", egress={"allow": [{"cidr": "127.0.0.1/32"}]}) as port,
        socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
    ):
        socks_login(sock, *STATIC)
        assert socks_connect(sock, 0) == 0x01  # not 0x05 "refused": the request is at fault, not the site
