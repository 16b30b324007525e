"""A forward proxy's control channel over TCP (a proxy pod's): real proxy processes on 127.0.0.1.

Every request must carry the token derived from the proxy's password (`stacks/forward_proxy/channel.py`):
with it a lease user is added and works; with a wrong token, none, or a line that is not even JSON, the
answer is the same `refused` (nothing about why) and the connection is closed; no user is added. A TCP
channel without a password is refused when the proxy starts. Each test fails on the code before, where
`control` was a unix socket path only and carried no credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stacks.forward_proxy import control
from stacks.forward_proxy.channel import control_token
from stacks.forward_proxy.reload import applied_path, digest
from stacks.programs import local_process as proc
from tests.ports import free_port
from tests.security.loopback_site import serve_page
from tests.security.tunnels import run_proxy, until

PASSWORD = "Pass1234"  # run_proxy's static credentials: crawler / Pass1234
NO_HOLD = {"lease_hold_seconds": 0}


@pytest.fixture
def site() -> Iterator[int]:
    with serve_page(b"through the proxy\n") as port:
        yield port


@pytest.fixture
def proxy(tmp_path: Path, site: int) -> Iterator[tuple[int, str]]:
    """(proxy port, control channel) of a proxy with a tcp control channel, allowing the site."""
    channel = f"tcp://127.0.0.1:{free_port()}"
    egress = {"allow": [{"cidr": "127.0.0.1/32", "ports": [site]}]}
    # No lease hold: these tests read a refusal of an unknown user at once (the hold: test_lease_hold.py).
    with run_proxy(tmp_path, control=channel, egress=egress, limits=NO_HOLD) as port:
        yield port, channel


def fetch(port: int, site: int, user: str, password: str) -> int:
    with httpx.Client(proxy=f"http://{user}:{password}@127.0.0.1:{port}", timeout=10) as client:
        return client.get(f"http://127.0.0.1:{site}/").status_code


def raw_exchange(channel: str, *lines: bytes, end: bool = False) -> list[Any]:
    """Send `lines` at once on one connection (then end it, when `end`), read until the proxy closes it:
    the answers it sent. A proxy that keeps it open fails the test with a timeout."""
    host, port = channel.removeprefix("tcp://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"".join(lines))
        if end:
            sock.shutdown(socket.SHUT_WR)
        data = b""
        with contextlib.suppress(ConnectionResetError):  # closed with our unread lines still queued
            while chunk := sock.recv(4096):
                data += chunk
    return [json.loads(line) for line in data.splitlines()]


def add(user: str, **extra: Any) -> bytes:
    return json.dumps({"op": "add", "user": user, "password": "s3cret", "ttl": 300, **extra}).encode() + b"\n"


def test_the_right_token_adds_a_user_that_works(proxy: tuple[int, str], site: int) -> None:
    port, channel = proxy
    assert fetch(port, site, "lease-1", "s3cret") == 407
    asyncio.run(
        control.call(
            channel,
            {"op": "add", "user": "lease-1", "password": "s3cret", "ttl": 300},
            wait=5,
            password=PASSWORD,
        )
    )
    assert fetch(port, site, "lease-1", "s3cret") == 200
    asyncio.run(control.call(channel, {"op": "revoke", "user": "lease-1"}, wait=5, password=PASSWORD))
    assert fetch(port, site, "lease-1", "s3cret") == 407


def test_several_requests_with_the_token_share_one_connection(proxy: tuple[int, str], site: int) -> None:
    port, channel = proxy
    token = control_token(PASSWORD)
    revoke = json.dumps({"op": "revoke", "user": "lease-2", "token": token}).encode() + b"\n"
    answers = raw_exchange(
        channel, add("lease-2", token=token), revoke, add("lease-3", token=token), end=True
    )
    assert answers == [{"ok": True}] * 3
    assert fetch(port, site, "lease-3", "s3cret") == 200


@pytest.mark.parametrize(
    "first",
    [
        add("lease-9", token=control_token("not-the-password")),
        add("lease-9", token=control_token(PASSWORD)[:-1] + "0"),
        add("lease-9"),
        add("lease-9", token=None),
        add("lease-9", token=["x"]),
        add("lease-9", token="é" * 64),
        b"not json\n",
        b"[1, 2]\n",
    ],
    ids=["other-password", "one-digit-off", "missing", "null", "list", "non-ascii", "not-json", "not-object"],
)
def test_anything_but_the_token_is_refused_alike_and_closed(
    proxy: tuple[int, str], site: int, first: bytes
) -> None:
    port, channel = proxy
    good = add("lease-9", token=control_token(PASSWORD))
    answers = raw_exchange(channel, first, good)  # closed by the proxy; the good line is never read
    assert answers == [{"ok": False, "error": "refused"}]
    assert fetch(port, site, "lease-9", "s3cret") == 407


def test_a_wrong_password_on_the_client_gets_a_control_error(proxy: tuple[int, str]) -> None:
    _, channel = proxy
    with pytest.raises(control.ControlError, match="refused"):
        asyncio.run(control.call(channel, {"op": "revoke", "user": "u"}, wait=5, password="guess"))
    with pytest.raises(control.ControlError, match="needs the proxy's password"):
        asyncio.run(control.call(channel, {"op": "revoke", "user": "u"}, wait=5))


def test_a_line_past_the_limit_closes_the_connection(proxy: tuple[int, str]) -> None:
    _, channel = proxy
    assert raw_exchange(channel, b"x" * (control.MAX_LINE * 2) + b"\n") == []  # closed, no answer


def test_a_tcp_channel_without_a_password_is_refused_at_start(tmp_path: Path) -> None:
    config = {"bind": "127.0.0.1", "port": free_port(), "protocol": "http", "egress": {}}
    config |= {"username": "crawler", "password": None, "control": f"tcp://127.0.0.1:{free_port()}"}
    config_file = tmp_path / "proxy.json"
    config_file.write_text(json.dumps(config))
    done = subprocess.run(
        proc.proxy_command(config_file), env=proc.child_environment(), capture_output=True, timeout=30
    )
    assert done.returncode != 0
    assert b"a tcp control channel needs the proxy's password" in done.stderr


def test_a_password_edited_in_place_moves_the_token_with_it(tmp_path: Path) -> None:
    """A SIGHUP that changes the static password (reload.py) changes the token at once: the old one is
    refused, the new one admitted (the token is derived per request, not fixed at start)."""
    port, channel = free_port(), f"tcp://127.0.0.1:{free_port()}"
    raw = {"bind": "127.0.0.1", "port": port, "protocol": "http", "egress": {}, "control": channel}
    raw |= {"username": "crawler", "password": PASSWORD}
    config_file, log = tmp_path / "p.json", tmp_path / "p.log"
    config_file.write_text(json.dumps(raw))
    ref = proc.spawn(proc.proxy_command(config_file), log_path=log)
    try:
        proc.wait_until_listening(ref, host="127.0.0.1", port=port, log_path=log)
        data = json.dumps({**raw, "password": "NewPass5678"}).encode()
        config_file.write_bytes(data)
        os.kill(ref.pid, signal.SIGHUP)
        answer = applied_path(config_file)
        assert until(lambda: answer.exists() and f"ok {digest(data)}" in answer.read_text(), within=5)
        revoke = {"op": "revoke", "user": "u"}
        with pytest.raises(control.ControlError, match="refused"):
            asyncio.run(control.call(channel, revoke, wait=5, password=PASSWORD))
        asyncio.run(control.call(channel, revoke, wait=5, password="NewPass5678"))
    finally:
        proc.stop(ref)
