"""The prober's reading of what a proxy answers, against scripted listeners on loopback, on both loops.

A scripted listener reads the probe's request and writes canned bytes, so each case is one way a proxy can
answer or fail: an answer without Content-Length (read to the end), one cut short, a garbled status line, a
hang-up before any answer, an answer split over many writes. The service runs the prober on uvloop
(service/api_server.py), whose transports are not asyncio's classes, so every case runs on both loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from service.health import probe as probe_module
from service.health.probe import ProbeResult, ProxyProber
from tests.service.conftest import endpoint

URL = "http://echo.test/v1/echo"
LOOPS: dict[str, Callable[[Coroutine[Any, Any, Any]], Any]] = {
    "asyncio": asyncio.run,
    "uvloop": uvloop.run,
}


def _through(
    chunks: list[bytes], *, pause: float = 0.0, timeout: float = 5.0
) -> Callable[[], Coroutine[Any, Any, ProbeResult]]:
    """A probe through a listener that answers `chunks` (written one by one) and then closes."""

    async def scenario() -> ProbeResult:
        requests: list[bytes] = []
        finished = asyncio.Event()

        async def scripted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                requests.append(await reader.readuntil(b"\r\n\r\n"))
                for chunk in chunks:
                    writer.write(chunk)
                    await writer.drain()
                    if pause:
                        await asyncio.sleep(pause)
                writer.close()
            except ConnectionError:
                pass  # the prober may hang up once it has read what it needs
            finally:
                finished.set()

        server = await asyncio.start_server(scripted, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            prober = ProxyProber(probe_url=URL, timeout=timeout)
            result = await prober.probe(endpoint("p", port=port, username="user", password="pass"))
            await asyncio.wait_for(finished.wait(), 5)  # no handler outlives the loop
        assert requests
        assert requests[0].startswith(b"GET http://echo.test/v1/echo HTTP/1.1\r\n")
        assert b"Proxy-Authorization: Basic dXNlcjpwYXNz\r\n" in requests[0]
        return result

    return scenario


OK_BODY = b'{"ip": "192.0.2.7"}'


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        pytest.param(
            [b"HTTP/1.1 200 OK\r\nContent-Length: 19\r\n\r\n" + OK_BODY], ("ok", "192.0.2.7"), id="length"
        ),
        pytest.param([b"HTTP/1.1 200 OK\r\n\r\n", OK_BODY], ("ok", "192.0.2.7"), id="to-the-end"),
        pytest.param(
            [b"HTTP/1.1 200 OK\r\nContent-Length: 90\r\n\r\n", OK_BODY],
            ("bad_response", None),
            id="cut-short",
        ),
        pytest.param([b"SSH-2.0-OpenSSH_9.2\r\n\r\n"], ("bad_response", None), id="garbled"),
        pytest.param([], ("proxy_error", None), id="hang-up"),
        pytest.param(
            [b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n"], ("auth_failed", None), id="407"
        ),
        pytest.param(
            [b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"], ("bad_status", None), id="502"
        ),
        pytest.param([b"HTTP/1.1 200 OK\r\n\r\n", b"not json"], ("ok", None), id="no-ip"),
    ],
)
def test_what_the_proxy_answers(loop: str, chunks: list[bytes], expected: tuple[str, str | None]) -> None:
    result = LOOPS[loop](_through(chunks)())
    assert (result.outcome, result.egress_ip) == expected, result.error
    assert result.ok == (expected[0] == "ok")


@pytest.mark.parametrize("loop", LOOPS)
def test_an_answer_in_many_small_writes_is_read_whole(loop: str) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 19\r\nX-Padding: " + b"x" * 300 + b"\r\n\r\n"
    answer = head + OK_BODY
    chunks = [answer[i : i + 7] for i in range(0, len(answer), 7)]  # a separator split across writes too
    result = LOOPS[loop](_through(chunks, pause=0.001)())
    assert (result.outcome, result.egress_ip) == ("ok", "192.0.2.7"), result.error


@pytest.mark.parametrize("loop", LOOPS)
def test_a_head_past_the_limit_is_a_bad_response(loop: str) -> None:
    endless = [b"HTTP/1.1 200 OK\r\n"] + [b"X-Padding: " + b"x" * 1000 + b"\r\n"] * 80  # 80 KB of headers
    result = LOOPS[loop](_through(endless)())
    assert result.outcome == "bad_response", result.error
    assert "end of the response head" in (result.error or "")


@pytest.mark.parametrize("loop", LOOPS)
def test_a_connect_that_hangs_is_a_connect_error_after_the_connect_timeout(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No listener on loopback can make a connect hang (the kernel answers at once), so the connection's
    opening is replaced by one that never completes: what is tested is the prober's one timer, which ends
    the connect at `connect_timeout` and names it, not at the probe's whole `timeout`."""

    async def never(cls: type, host: str, port: int) -> None:
        await asyncio.sleep(3600)

    monkeypatch.setattr(probe_module.ProbeConnection, "open", classmethod(never))

    async def scenario() -> ProbeResult:
        prober = ProxyProber(probe_url=URL, connect_timeout=0.2, timeout=30)
        return await asyncio.wait_for(prober.probe(endpoint("p", port=9)), 10)

    result = LOOPS[loop](scenario())
    assert (result.ok, result.outcome) == (False, "connect_error")
    assert result.error == "connect timed out after 0.2s"
    assert result.latency_seconds < 5  # the connect's deadline, far from the probe's 30 s


@pytest.mark.parametrize("loop", LOOPS)
def test_a_probe_leaves_no_connection_open(loop: str) -> None:
    """After a thousand probes on one loop, the process holds no more sockets than before."""

    def sockets() -> int:
        import os

        count = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
            except OSError:
                continue
        return count

    async def scenario() -> tuple[int, int]:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 19\r\n\r\n" + OK_BODY)
            await writer.drain()
            with contextlib.suppress(TimeoutError, ConnectionError):  # the prober hangs up, or not
                await asyncio.wait_for(reader.read(), 2)
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0, family=socket.AF_INET)
        port = server.sockets[0].getsockname()[1]
        async with server:
            prober = ProxyProber(probe_url=URL)
            before = sockets()
            probes = asyncio.gather(*(prober.probe(endpoint("p", port=port)) for _ in range(200)))
            results = await asyncio.wait_for(probes, 30)
            await asyncio.sleep(0.2)  # the server's side of each connection closes
            after = sockets()
        assert all(r.ok for r in results), {r.error for r in results}
        return before, after

    before, after = LOOPS[loop](scenario())
    assert after <= before
