"""One probe: TCP connect to the proxy, then fetch the probe URL through it with the proxy's credentials.

HTTP proxies get an absolute-URI GET (plain http) or CONNECT + TLS (https); SOCKS5 proxies a SOCKS5 handshake
with username/password, then the request. Written on one asyncio Protocol per connection (`probe_conn.py`),
with no client object per probe, so one core probes thousands of proxies per second. The echo route's JSON
`ip` is the egress IP.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from service.health.errors import ProbeFailed
from service.health.probe_conn import ProbeConnection
from service.health.socks5 import Socks5Error, socks5_connect
from service.inventory import ProxyEndpoint, interned

__all__ = ["MAX_RESPONSE", "ProbeFailed", "ProbeResult", "ProxyProber"]

MAX_RESPONSE = 64 * 1024
HEADS_KEPT = 64  # (method, target) request heads kept made; past it they start over


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    # ok | connect_error | timeout | proxy_error | auth_failed | bad_status | bad_response; the engine adds
    # unverified (a local proxy's port not held by its process: not probed, service/health/listener.py)
    outcome: str
    latency_seconds: float
    egress_ip: str | None = None
    error: str | None = None


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
        self._heads: dict[tuple[str, str], bytes] = {}

    async def probe(self, endpoint: ProxyEndpoint) -> ProbeResult:
        start = self._clock()
        connection: ProbeConnection | None = None
        # One timer for the whole probe: the connect's deadline first, then the probe's.
        deadline = asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout_at(deadline + min(self._connect_timeout, self._timeout)) as timer:
                if endpoint.host is None or endpoint.port is None:
                    raise ProbeFailed("connect_error", "the proxy has no address yet")
                try:
                    connection = await ProbeConnection.open(endpoint.host, endpoint.port)
                except OSError as exc:
                    raise ProbeFailed(
                        "connect_error", f"connect to {endpoint.host}:{endpoint.port}: {exc}"
                    ) from exc
                timer.reschedule(deadline + self._timeout)
                ip = await self._probe(endpoint, connection)
        except ProbeFailed as exc:
            return ProbeResult(False, exc.outcome, self._clock() - start, error=str(exc))
        except TimeoutError:
            if connection is None and self._connect_timeout < self._timeout:
                error = f"connect timed out after {self._connect_timeout}s"
                return ProbeResult(False, "connect_error", self._clock() - start, error=error)
            return ProbeResult(
                False, "timeout", self._clock() - start, error=f"no answer in {self._timeout}s"
            )
        except (OSError, ValueError) as exc:  # TLS errors, resets mid-write, hostnames that do not encode
            error = f"{type(exc).__name__}: {exc}"
            return ProbeResult(False, "proxy_error", self._clock() - start, error=error)
        finally:
            if connection is not None:
                await connection.close()
        # a fleet behind one NAT shares one string
        return ProbeResult(True, "ok", self._clock() - start, egress_ip=interned(ip))

    async def _probe(self, endpoint: ProxyEndpoint, connection: ProbeConnection) -> str | None:
        if endpoint.protocol == "socks5":
            await self._socks5(endpoint, connection)
            request_target = self._path
        elif self._https:
            await self._http_connect(endpoint, connection)
            request_target = self._path
        else:
            request_target = self._url
        if self._https:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            await connection.start_tls(self._ssl, server_hostname=self._host)
        auth = endpoint.protocol == "http" and not self._https
        connection.write(
            self._request("GET", request_target, credentials=_credentials(endpoint) if auth else None)
        )
        status, body = await _read_response(connection)
        if status == 407:
            raise ProbeFailed("auth_failed", "the proxy refused its credentials (407)")
        if not 200 <= status < 400:
            raise ProbeFailed("bad_status", f"probe URL answered {status} through the proxy")
        return _egress_ip(body)

    async def _http_connect(self, endpoint: ProxyEndpoint, connection: ProbeConnection) -> None:
        target = f"{self._host}:{self._port}"
        connection.write(self._request("CONNECT", target, credentials=_credentials(endpoint)))
        status, _ = await _read_head(connection)
        if status == 407:
            raise ProbeFailed("auth_failed", "the proxy refused its credentials (407)")
        if status != 200:
            raise ProbeFailed("proxy_error", f"CONNECT answered {status}")

    async def _socks5(self, endpoint: ProxyEndpoint, connection: ProbeConnection) -> None:
        try:
            await socks5_connect(
                connection,
                connection,
                host=self._host,
                port=self._port,
                username=endpoint.username,
                password=endpoint.password,
            )
        except Socks5Error as exc:
            raise ProbeFailed(exc.outcome, str(exc)) from exc

    def _request(self, method: str, target: str, *, credentials: tuple[str, str] | None) -> bytes:
        """The request's bytes: its head made once per method and target, the credentials' line per probe
        (proxies have credentials of their own: a request kept per proxy was 200 bytes each at 10,000)."""
        head = self._heads.get((method, target))
        if head is None:
            host = f"Host: {self._host}:{self._port}"
            lines = (f"{method} {target} HTTP/1.1", host, "Connection: close", "")
            head = "\r\n".join(lines).encode()
            if len(self._heads) >= HEADS_KEPT:
                self._heads.clear()
            self._heads[(method, target)] = head
        if credentials is None:
            return head + b"\r\n"
        token = base64.b64encode(f"{credentials[0]}:{credentials[1]}".encode())
        return b"".join((head, b"Proxy-Authorization: Basic ", token, b"\r\n\r\n"))


def _credentials(endpoint: ProxyEndpoint) -> tuple[str, str] | None:
    if endpoint.username is None:
        return None
    return endpoint.username, endpoint.password or ""


async def _read_head(connection: ProbeConnection) -> tuple[int, dict[str, str]]:
    head = await connection.readuntil(b"\r\n\r\n", limit=MAX_RESPONSE)
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


async def _read_response(connection: ProbeConnection) -> tuple[int, bytes]:
    status, headers = await _read_head(connection)
    length = headers.get("content-length")
    try:
        if length is not None:
            return status, await connection.readexactly(min(int(length), MAX_RESPONSE))
        return status, await connection.read_to_end(MAX_RESPONSE)
    except ValueError as exc:
        raise ProbeFailed("bad_response", f"bad Content-Length {length!r}") from exc
    except ProbeFailed as exc:
        raise ProbeFailed("bad_response", f"response body cut short: {exc}") from exc


def _egress_ip(body: bytes) -> str | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    ip = data.get("ip") if isinstance(data, dict) else None
    return ip if isinstance(ip, str) else None
