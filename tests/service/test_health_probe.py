"""The prober against real pproxy processes on loopback, through to the service's own echo route."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

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
