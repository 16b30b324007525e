"""An edited configuration applied to a running forward proxy (SIGHUP, `stacks/forward_proxy/reload.py`):
the egress edit takes effect for new connections while open tunnels, lease users and the process stay; an
edit that needs a new process is refused, said so in `<config>.applied`, and the old configuration goes on.

Before: the proxy had no reload, so the `local` provider replaced every process of a stack on an egress edit
(`replace: 3`), which cut every tunnel and lost every lease user.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stacks.forward_proxy.reload import applied_path, digest
from stacks.programs import local_process as proc
from tests.ports import free_port
from tests.security.loopback_echo import Echo, serve_echo
from tests.security.tunnels import basic, connect_tunnel, read_head, until

STATIC = ("crawler", "Pass1234")


@pytest.fixture
def two_echoes() -> Iterator[tuple[Echo, Echo]]:
    with serve_echo() as first, serve_echo() as second:
        yield first, second


def _allow(*ports: int) -> dict[str, Any]:
    return {"allow": [{"cidr": "127.0.0.1/32", "ports": list(ports)}]}


def _connect_status(proxy: int, target: int) -> bytes:
    with socket.create_connection(("127.0.0.1", proxy), timeout=5) as sock:
        request = f"CONNECT 127.0.0.1:{target} HTTP/1.1\r\nHost: x\r\n"
        sock.sendall(f"{request}Proxy-Authorization: Basic {basic(*STATIC)}\r\n\r\n".encode())
        return read_head(sock).split(b"\r\n")[0]


def _apply(config_file: Path, ref: proc.ProcessRef, raw: dict[str, Any]) -> str:
    """Write `raw`, send SIGHUP, and return the proxy's answer to exactly this file."""
    data = json.dumps(raw).encode()
    config_file.write_bytes(data)
    os.kill(ref.pid, signal.SIGHUP)
    answer = applied_path(config_file)
    assert until(lambda: answer.exists() and digest(data) in answer.read_text(), within=5)
    return answer.read_text().strip()


def test_an_egress_edit_is_applied_in_place_and_open_tunnels_stay(
    tmp_path: Path, two_echoes: tuple[Echo, Echo]
) -> None:
    first, second = two_echoes
    port = free_port()
    raw = {"bind": "127.0.0.1", "port": port, "protocol": "http", "egress": _allow(first.port)}
    raw |= {"username": STATIC[0], "password": STATIC[1]}
    config_file, log = tmp_path / "p.json", tmp_path / "p.log"
    config_file.write_text(json.dumps(raw))
    ref = proc.spawn(proc.proxy_command(config_file), log_path=log)
    try:
        proc.wait_until_listening(ref, host="127.0.0.1", port=port, log_path=log)
        tunnel = connect_tunnel(port, first.port, *STATIC)
        assert b" 403 " in _connect_status(port, second.port)  # not allowed yet

        answer = _apply(config_file, ref, {**raw, "egress": _allow(first.port, second.port)})

        assert answer.startswith("ok ")
        assert _connect_status(port, second.port).startswith(b"HTTP/1.1 200")  # the edit holds
        assert tunnel.ping()  # the tunnel opened before the edit still relays: same process
        assert proc.is_running(ref)
        moved = _apply(config_file, ref, {**raw, "port": free_port()})
        assert moved.startswith("refused ")
        assert "port need a new process" in moved
        assert _connect_status(port, second.port).startswith(b"HTTP/1.1 200")  # the last applied stays
        tunnel.close()
    finally:
        proc.stop(ref)
