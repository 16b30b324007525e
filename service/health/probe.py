"""One probe: TCP connect to the proxy, then fetch the probe URL through it with the proxy's credentials.

HTTP proxies get an absolute-URI GET (plain http) or CONNECT + TLS (https); SOCKS5 proxies a SOCKS5
handshake with username/password, then the request. Written on asyncio streams, with no client object per
probe, so one core probes thousands of proxies per second. The echo route's JSON `ip` is the egress IP.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from service.health.socks5 import Socks5Error, socks5_connect
from service.inventory import ProxyEndpoint

MAX_RESPONSE = 64 * 1024


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    # ok | connect_error | timeout | proxy_error | auth_failed | bad_status | bad_response; the engine adds
    # unverified (a local proxy's port not held by its process: not probed, service/health/listener.py)
    outcome: str
    latency_seconds: float
    egress_ip: str | None = None
    error: str | None = None


class ProbeFailed(Exception):
    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


class ProxyProber:
    """Probes through HTTP and SOCKS5 proxies. Timeouts: `connect_timeout` for TCP, `timeout` for it all."""

    def __init__(
        self,
        *,
        probe_url: str,
        connect_timeout: float = 3.0,
        timeout: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        parts = urlsplit(probe_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"probe_url must be an http(s) URL with a host, got {probe_url!r}")
        self._url = probe_url
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._connect_timeout = connect_timeout
        self._timeout = timeout
        self._clock = clock
        self._ssl = ssl_context  # None: the system's trust store, made on first https probe

    async def probe(self, endpoint: ProxyEndpoint) -> ProbeResult:
        start = self._clock()
        try:
            async with asyncio.timeout(self._timeout):
                ip = await self._probe(endpoint)
        except ProbeFailed as exc:
            return ProbeResult(False, exc.outcome, self._clock() - start, error=str(exc))
        except TimeoutError:
            return ProbeResult(
                False, "timeout", self._clock() - start, error=f"no answer in {self._timeout}s"
            )
        except (OSError, ValueError) as exc:  # TLS errors, resets mid-write, hostnames that do not encode
            error = f"{type(exc).__name__}: {exc}"
            return ProbeResult(False, "proxy_error", self._clock() - start, error=error)
        return ProbeResult(True, "ok", self._clock() - start, egress_ip=ip)

    async def _probe(self, endpoint: ProxyEndpoint) -> str | None:
        reader, writer = await self._connect(endpoint)
        try:
            if endpoint.protocol == "socks5":
                await self._socks5(endpoint, reader=reader, writer=writer)
                request_target = self._path
            elif self._https:
                await self._http_connect(endpoint, reader=reader, writer=writer)
                request_target = self._path
            else:
                request_target = self._url
            if self._https:
                if self._ssl is None:
                    self._ssl = ssl.create_default_context()
                await writer.start_tls(self._ssl, server_hostname=self._host)
            auth = endpoint.protocol == "http" and not self._https
            writer.write(self._request("GET", request_target, endpoint=endpoint if auth else None))
            status, body = await _read_response(reader)
        finally:
            await _close(writer)
        if status == 407:
            raise ProbeFailed("auth_failed", "the proxy refused its credentials (407)")
        if not 200 <= status < 400:
            raise ProbeFailed("bad_status", f"probe URL answered {status} through the proxy")
        return _egress_ip(body)

    async def _connect(self, endpoint: ProxyEndpoint) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            async with asyncio.timeout(self._connect_timeout):
                return await asyncio.open_connection(endpoint.host, endpoint.port)
        except TimeoutError as exc:
            raise ProbeFailed("connect_error", f"connect timed out after {self._connect_timeout}s") from exc
        except OSError as exc:
            raise ProbeFailed("connect_error", f"connect to {endpoint.host}:{endpoint.port}: {exc}") from exc

    async def _http_connect(
        self, endpoint: ProxyEndpoint, *, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        writer.write(self._request("CONNECT", f"{self._host}:{self._port}", endpoint=endpoint))
        status, _ = await _read_head(reader)
        if status == 407:
            raise ProbeFailed("auth_failed", "the proxy refused its credentials (407)")
        if status != 200:
            raise ProbeFailed("proxy_error", f"CONNECT answered {status}")

    async def _socks5(
        self, endpoint: ProxyEndpoint, *, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            await socks5_connect(
                reader,
                writer,
                host=self._host,
                port=self._port,
                username=endpoint.username,
                password=endpoint.password,
            )
        except Socks5Error as exc:
            raise ProbeFailed(exc.outcome, str(exc)) from exc

    def _request(self, method: str, target: str, *, endpoint: ProxyEndpoint | None) -> bytes:
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self._host}:{self._port}", "Connection: close"]
        if endpoint is not None and endpoint.username is not None:
            token = base64.b64encode(f"{endpoint.username}:{endpoint.password or ''}".encode()).decode()
            lines.append(f"Proxy-Authorization: Basic {token}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _close(writer: asyncio.StreamWriter) -> None:
    # Wait for the close (a TLS close is a short exchange), so no transport outlives its probe.
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), 1.0)


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as exc:
        raise ProbeFailed("proxy_error", f"the proxy closed or garbled the response: {exc}") from exc
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError) as exc:
        raise ProbeFailed("bad_response", f"not an HTTP status line: {lines[0][:80]!r}") from exc
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status, headers = await _read_head(reader)
    try:
        if "content-length" in headers:
            body = await reader.readexactly(min(int(headers["content-length"]), MAX_RESPONSE))
        else:
            body = await reader.read(MAX_RESPONSE)
    except (asyncio.IncompleteReadError, ValueError, OSError) as exc:
        raise ProbeFailed("bad_response", f"response body cut short: {exc}") from exc
    return status, body


def _egress_ip(body: bytes) -> str | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    ip = data.get("ip") if isinstance(data, dict) else None
    return ip if isinstance(ip, str) else None
