"""Clients of the forward proxy for the connection-level tests: tunnels that stream to the echo server, and
a proxy process started on a config file of the test's own (limits the `local` provider leaves at their
defaults).

A `Tunnel` is an open connection through the proxy to `loopback_echo`: `ping` sends a chunk and reads it
back, so a test streams bytes and sees the moment the proxy cuts it (EOF or reset, never a timeout).
"""

from __future__ import annotations

import base64
import json
import socket
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from stacks.programs import local_process as proc
from tests.ports import free_port

CHUNK = 512


class Tunnel:
    """One client connection through the proxy, counting what it sent and what came back."""

    def __init__(self, sock: socket.socket, *, head: int = 0) -> None:
        self.sock = sock
        self.head = head  # bytes the site received before the first chunk (a forwarded request's head)
        self.sent = 0
        self.echoed = 0

    def ping(self) -> bool:
        """Send a chunk and read it back: True; False when the proxy closed the connection meanwhile."""
        try:
            self.sock.sendall(b"x" * CHUNK)
            self.sent += CHUNK
            missing = CHUNK
            while missing:
                data = self.sock.recv(missing)
                if not data:
                    return False
                missing -= len(data)
                self.echoed += len(data)
        except (ConnectionResetError, BrokenPipeError):
            return False
        return True

    def keep_sending(self, seconds: float) -> None:
        """Try to send for `seconds` whatever happens (after a cut: nothing may reach the site)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with suppress(OSError):
                self.sock.sendall(b"y" * CHUNK)
            time.sleep(0.02)

    def close(self) -> None:
        self.sock.close()


def stream(tunnels: list[Tunnel], *, watch: Tunnel, within: float) -> float | None:
    """Ping every tunnel in turn until `watch` is cut: the time it was, or None when it still works after
    `within` seconds. Every other tunnel must keep working throughout."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for tunnel in tunnels:
            if not tunnel.ping():
                assert tunnel is watch, "a connection that should have stayed was cut"
                return time.monotonic()
        time.sleep(0.02)
    return None


def closed(sock: socket.socket, *, within: float) -> bool:
    """Does the proxy close `sock` within `within` seconds (whatever it writes first)?"""
    deadline = time.monotonic() + within
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return False


def read_head(sock: socket.socket) -> bytes:
    """Bytes up to the end of an HTTP head (the proxy's answer, or the echo of a forwarded request)."""
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(1)
        if not data:
            raise ConnectionError(f"closed after {head!r}")
        head += data
    return head


def basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def _connect(proxy: int, *, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy), timeout=5, source_address=(source, 0))
    sock.settimeout(5)
    return sock


def connect_tunnel(proxy: int, target: int, user: str, password: str) -> Tunnel:
    """A CONNECT tunnel to 127.0.0.1:`target`, authenticated with HTTP Basic."""
    sock = _connect(proxy)
    request = f"CONNECT 127.0.0.1:{target} HTTP/1.1\r\nHost: 127.0.0.1:{target}\r\n"
    sock.sendall(f"{request}Proxy-Authorization: Basic {basic(user, password)}\r\n\r\n".encode())
    head = read_head(sock)
    assert head.startswith(b"HTTP/1.1 200"), head
    return Tunnel(sock)


def forward_request(proxy: int, target: int, user: str, password: str) -> Tunnel:
    """A plain-HTTP POST to 127.0.0.1:`target` whose body is still being sent: a request in the middle."""
    sock = _connect(proxy)
    request = f"POST http://127.0.0.1:{target}/ HTTP/1.1\r\nHost: 127.0.0.1:{target}\r\n"
    request += f"Content-Length: 100000000\r\nProxy-Authorization: Basic {basic(user, password)}\r\n\r\n"
    sock.sendall(request.encode())
    forwarded = read_head(sock)  # the echo server returns the forwarded head; the body's chunks follow
    return Tunnel(sock, head=len(forwarded))


def socks_login(sock: socket.socket, user: str, password: str) -> None:
    sock.sendall(b"\x05\x01\x02")
    assert sock.recv(2) == b"\x05\x02"
    sock.sendall(bytes([1, len(user)]) + user.encode() + bytes([len(password)]) + password.encode())
    assert sock.recv(2) == b"\x01\x00"


def socks_connect(sock: socket.socket, port: int) -> int:
    """Ask for 127.0.0.1:`port` after the login; the reply code (0: succeeded)."""
    sock.sendall(b"\x05\x01\x00\x01" + socket.inet_aton("127.0.0.1") + struct.pack("!H", port))
    reply = sock.recv(10)
    assert reply[:1] == b"\x05", reply
    return reply[1]


def socks_tunnel(proxy: int, target: int, user: str, password: str) -> Tunnel:
    sock = _connect(proxy)
    socks_login(sock, user, password)
    assert socks_connect(sock, target) == 0
    return Tunnel(sock)


Opener = Callable[[int, int, str, str], Tunnel]


def until(condition: Callable[[], bool], *, within: float) -> bool:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@contextmanager
def run_proxy(folder: Path, **config: Any) -> Iterator[int]:
    """A forward proxy process on a config file with `config` (over an authenticated HTTP default) and the
    port it listens on; stopped on leaving."""
    port = free_port()
    raw = {"bind": "127.0.0.1", "port": port, "protocol": "http", "egress": {}}
    raw |= {"username": "crawler", "password": "Pass1234", **config}
    config_file, log = folder / f"p{port}.json", folder / f"p{port}.log"
    config_file.write_text(json.dumps(raw))
    ref = proc.spawn(proc.proxy_command(config_file), log_path=log)
    try:
        proc.wait_until_listening(ref, host="127.0.0.1", port=port, log_path=log)
        yield port
    finally:
        proc.stop(ref)
