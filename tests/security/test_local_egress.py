"""A real `local` proxy process (started by the provider, as `up` starts it) against real loopback sites.

Each test fails on the code before issue 11, where pproxy forwarded anything to anywhere and closed the
connection when a site was down: the default refuses loopback for real (HTTP, CONNECT, SOCKS5, every
spelling), a refusal is recognisably the proxy's (RFC 9209 `Proxy-Status`), a site that is down is a 502,
only explicitly allowed sites pass, sources outside `allowedSourceRanges` are turned away, and the process
does not inherit the service's environment.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from stacks.programs.local import LocalProxyProvider
from tests.ports import free_port
from tests.security.loopback_site import serve_page

PAGE = b"loopback secret\n"


@pytest.fixture
def site() -> Iterator[int]:
    with serve_page(PAGE) as port:
        yield port


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    """Start a proxy through the provider's create; every one is deleted at the end."""
    provider, started = LocalProxyProvider(), []

    class Run:
        pids: ClassVar[list[int]] = []

        created: ClassVar[list[Any]] = []

        def __call__(self, **kwargs: Any) -> int:
            return run(**kwargs)

    def run(*, protocol: str = "http", egress: dict[str, Any] | None = None, **extra: Any) -> int:
        port = free_port()
        props = {"state_dir": str(tmp_path), "stem": f"p{port}", "bind_address": "127.0.0.1", "port": port}
        props |= {"protocol": protocol, "username": "crawler", "password": "Pass1234", "egress": egress or {}}
        created = provider.create({**props, **extra})
        started.append(created)
        Run.created.append(created)
        Run.pids.append(int(created.outs["pid"]))
        return port

    yield Run()
    for created in started:
        provider.delete(created.id, created.outs)


def _client(port: int) -> httpx.Client:
    return httpx.Client(proxy=f"http://crawler:Pass1234@127.0.0.1:{port}", timeout=10)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "2130706433", "0.0.0.0"])
def test_the_default_refuses_a_loopback_site_in_every_spelling(start: Any, site: int, host: str) -> None:
    with _client(start()) as client:
        response = client.get(f"http://{host}:{site}/")
    assert response.status_code == 403
    assert PAGE not in response.content
    assert response.headers["Proxy-Status"].startswith("proxy-operator; error=destination_ip_prohibited")


def test_a_tunnel_to_a_refused_site_fails_at_connect(start: Any, site: int) -> None:
    with _client(start()) as client, pytest.raises(httpx.ProxyError, match="403"):
        client.get(f"https://127.0.0.1:{site}/")


def test_an_explicitly_allowed_site_passes_and_its_neighbours_do_not(start: Any, site: int) -> None:
    port = start(egress={"allow": [{"cidr": "127.0.0.1/32", "ports": [site]}]})
    with _client(port) as client:
        assert client.get(f"http://127.0.0.1:{site}/").content == PAGE
        assert client.get(f"http://127.0.0.1:{port}/").status_code == 403  # another port of this host


def test_a_site_that_is_down_is_a_502_naming_the_cause(start: Any) -> None:
    down = free_port()  # nothing listens there
    with _client(start(egress={"allow": [{"cidr": "127.0.0.1/32"}]})) as client:
        response = client.get(f"http://127.0.0.1:{down}/")
    assert response.status_code == 502
    assert response.headers["Proxy-Status"].startswith("proxy-operator; error=connection_refused")


def _socks5_connect(proxy: int, site: int) -> int:
    """SOCKS5 user/pass, CONNECT 127.0.0.1:site; returns the reply code."""
    with socket.create_connection(("127.0.0.1", proxy), timeout=5) as sock:
        sock.sendall(b"\x05\x01\x02")
        assert sock.recv(2) == b"\x05\x02"
        sock.sendall(b"\x01\x07crawler\x08Pass1234")
        assert sock.recv(2) == b"\x01\x00"
        sock.sendall(b"\x05\x01\x00\x01" + socket.inet_aton("127.0.0.1") + site.to_bytes(2, "big"))
        return sock.recv(10)[1]


def test_socks5_refuses_loopback_with_not_allowed_by_ruleset(start: Any, site: int) -> None:
    assert _socks5_connect(start(protocol="socks5"), site) == 0x02
    allowed = start(protocol="socks5", egress={"allow": [{"cidr": "127.0.0.1/32", "ports": [site]}]})
    assert _socks5_connect(allowed, site) == 0x00


def test_a_source_outside_the_allowed_ranges_is_turned_away(start: Any, site: int) -> None:
    port = start(sources=["10.0.0.0/8"], egress={"allow": [{"cidr": "127.0.0.1/32"}]})
    with _client(port) as client, pytest.raises(httpx.TransportError):  # closed or reset, never served
        client.get(f"http://127.0.0.1:{site}/")


def test_the_proxy_does_not_inherit_the_services_environment(
    start: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "service-secret-passphrase")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "service-secret-key")
    start()
    pid = start.pids[-1]
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert b"service-secret" not in environ
    assert b"PULUMI_CONFIG_PASSPHRASE" not in environ
    assert b"Pass1234" not in Path(f"/proc/{pid}/cmdline").read_bytes()  # read from a 0600 file


def test_an_egress_edit_reaches_the_running_process_and_its_tunnel_stays(start: Any, site: int) -> None:
    """The provider's update applies an egress edit to the process it started (SIGHUP, no new process):
    the site it now allows passes, a tunnel opened before the edit still relays, the pid is the same.
    Before: the edit replaced the process, cutting the tunnel."""
    with serve_page(b"other page\n") as other:
        port = start(egress={"allow": [{"cidr": "127.0.0.1/32", "ports": [other]}]})
        created = start.created[-1]
        with _client(port) as client:
            assert client.get(f"http://127.0.0.1:{site}/").status_code == 403
        with socket.create_connection(("127.0.0.1", port), timeout=5) as tunnel:
            tunnel.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n" % other)
            tunnel.sendall(b"Proxy-Authorization: Basic Y3Jhd2xlcjpQYXNzMTIzNA==\r\n\r\n")
            assert tunnel.recv(4096).startswith(b"HTTP/1.1 200")
            allow = [{"cidr": "127.0.0.1/32", "ports": [site, other]}]
            news = {**created.outs, "egress": {"allow": allow}}
            provider = LocalProxyProvider()
            assert provider.diff(created.id, created.outs, news).replaces == []
            updated = provider.update(created.id, created.outs, news)
            assert updated.outs["pid"] == created.outs["pid"]
            with _client(port) as client:
                answer = client.get(f"http://127.0.0.1:{site}/")
            assert (answer.status_code, answer.content) == (200, PAGE)
            tunnel.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            received = b""
            while chunk := tunnel.recv(4096):
                received += chunk
            assert received.endswith(b"other page\n")  # the tunnel from before the edit still relays
