"""The prober against real pproxy processes on loopback, through to the service's own echo route."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from service.health.probe import ProxyProber
from tests.service.conftest import Pproxy, endpoint


def _probe(prober: ProxyProber, proxy: Pproxy, **extra: object):  # type: ignore[no-untyped-def]
    ep = endpoint("p", port=proxy.port, protocol=proxy.protocol, username="user", password="pass")
    if extra:
        ep = endpoint("p", port=proxy.port, protocol=proxy.protocol, **extra)
    return asyncio.run(prober.probe(ep))


@pytest.mark.parametrize("protocol", ["http", "socks5"])
def test_a_probe_through_a_proxy_learns_its_egress_ip(
    protocol: str, echo_url: str, pproxies: Callable[..., Pproxy]
) -> None:
    proxy = pproxies(protocol=protocol)
    result = _probe(ProxyProber(probe_url=echo_url, connect_timeout=10, timeout=20), proxy)  # a loaded CI box
    assert (result.ok, result.outcome, result.egress_ip) == (True, "ok", "127.0.0.1"), result.error
    assert result.latency_seconds > 0
    again = _probe(ProxyProber(probe_url=echo_url, connect_timeout=10, timeout=20), proxy)
    assert again.egress_ip is result.egress_ip  # one string for a fleet behind one address (issue 20)


@pytest.mark.parametrize(
    ("protocol", "outcome"),
    [("http", "auth_failed"), ("socks5", "proxy_error")],  # pproxy's SOCKS5 hangs up instead of replying
)
def test_wrong_credentials_fail_the_probe(
    protocol: str, outcome: str, echo_url: str, pproxies: Callable[..., Pproxy]
) -> None:
    # A fresh pproxy: it remembers an address that once authenticated, so this must be the first use.
    proxy = pproxies(protocol=protocol)
    result = _probe(ProxyProber(probe_url=echo_url), proxy, username="user", password="wrong")
    assert (result.ok, result.outcome) == (False, outcome)
    assert result.egress_ip is None


def test_a_stopped_proxy_is_a_connect_error(echo_url: str, pproxies: Callable[..., Pproxy]) -> None:
    proxy = pproxies()
    proxy.stop()
    result = _probe(ProxyProber(probe_url=echo_url), proxy)
    assert (result.ok, result.outcome) == (False, "connect_error")


def test_a_silent_listener_times_out(echo_url: str) -> None:
    async def scenario() -> str:
        done = asyncio.Event()

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()  # never answers; ends when the prober hangs up
            writer.close()
            await writer.wait_closed()
            done.set()

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            prober = ProxyProber(probe_url=echo_url, timeout=0.3)
            result = await prober.probe(endpoint("p", port=port))
            await asyncio.wait_for(done.wait(), 5)
        return result.outcome

    assert asyncio.run(scenario()) == "timeout"


def test_a_bad_probe_url_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="probe_url"):
        ProxyProber(probe_url="ftp://example.com/")


@pytest.fixture
def tls_echo(tmp_path: Path) -> Iterator[tuple[str, ssl.SSLContext]]:
    """An HTTPS echo site on 127.0.0.1 with a self-signed certificate (openssl), and a context trusting it."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))

    class Echo(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name http.server calls
            body = json.dumps({"ip": self.client_address[0]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    server.socket = server_ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="tls-echo")
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}/echo", client_ctx
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize("protocol", ["http", "socks5"])  # http: CONNECT, then TLS through the tunnel
def test_an_https_probe_url_goes_through_the_tunnel(
    protocol: str, tls_echo: tuple[str, ssl.SSLContext], pproxies: Callable[..., Pproxy]
) -> None:
    url, trust = tls_echo
    proxy = pproxies(protocol=protocol)
    result = _probe(ProxyProber(probe_url=url, ssl_context=trust, timeout=20), proxy)
    assert (result.ok, result.egress_ip) == (True, "127.0.0.1"), result.error


def test_an_untrusted_certificate_fails_the_probe(
    tls_echo: tuple[str, ssl.SSLContext], pproxies: Callable[..., Pproxy]
) -> None:
    url, _ = tls_echo
    result = _probe(ProxyProber(probe_url=url, timeout=20), pproxies())
    assert (result.ok, result.outcome) == (False, "proxy_error")
    assert "SSL" in (result.error or "")
