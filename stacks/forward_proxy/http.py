"""HTTP proxying: absolute-form requests forwarded over a fresh connection, CONNECT tunnels, Basic auth.

The request head must be complete within `limits.head_seconds` of the accept (else 408 and closed), and a
port outside 1..65535 (or not a plain decimal number) is a 400 before anything is resolved.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import re

from stacks.forward_proxy.connection import Connection
from stacks.forward_proxy.dial import DialError, Streams, valid_port
from stacks.forward_proxy.occupancy import Full

PROXY_NAME = "proxy-operator"
MAX_HEAD = 64 * 1024
REASONS = {400: "Bad Request", 403: "Forbidden", 407: "Proxy Authentication Required", 502: "Bad Gateway"}
REASONS |= {504: "Gateway Timeout", 431: "Request Header Fields Too Large", 408: "Request Timeout"}
REASONS |= {429: "Too Many Requests", 503: "Service Unavailable"}
FULL = {Full.SOURCE: (429, "too many connections from this address"), Full.TOTAL: (503, "proxy full")}
PORT = re.compile(r"[0-9]{1,5}")
# Hop-by-hop headers and our own credentials never travel on to the site.
DROPPED = {"proxy-authorization", "proxy-connection", "connection", "keep-alive", "te", "upgrade"}


def proxy_status(error: str, detail: str) -> str:
    """An RFC 9209 Proxy-Status value (details as an sf-string: printable ASCII, quotes escaped)."""
    text = "".join(c for c in detail if 32 <= ord(c) < 127).replace("\\", "\\\\").replace('"', '\\"')
    return f'{PROXY_NAME}; error={error}; details="{text}"'


def _reply(writer: asyncio.StreamWriter, status: int, headers: dict[str, str] | None = None) -> None:
    body = f"{status} {REASONS.get(status, '')}\n".encode()
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, '')}", f"Content-Length: {len(body)}"]
    lines += ["Content-Type: text/plain", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)


def refuse(writer: asyncio.StreamWriter, full: Full) -> None:
    """A connection past a cap: answered at once, without reading its request."""
    status, detail = FULL[full]
    _reply(writer, status, {"Proxy-Status": proxy_status("connection_limit_reached", detail)})


async def _authorized(headers: list[tuple[str, str]], conn: Connection) -> bool:
    if conn.open:
        return True
    for name, value in headers:
        scheme, _, token = value.partition(" ")
        if name.lower() == "proxy-authorization" and scheme.lower() == "basic":
            try:
                given = base64.b64decode(token.strip(), validate=True)
            except (binascii.Error, ValueError):
                return False
            user, _, password = given.partition(b":")
            return await conn.admit(user, password)
    return False


def _host_port(authority: str, default: int) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or a bare host; a bare IPv6 address (sent unbracketed by some clients) is
    read whole when it parses whole, else up to its last colon. A ValueError without a host, or with a port
    that is not 1 to 65535 in decimal digits (`int` would take `+80`, `8_0`, `-1` and 99999)."""
    if authority.count(":") > 1 and not authority.startswith("["):
        try:
            return str(ipaddress.IPv6Address(authority)), default
        except ValueError:
            pass
    host, sep, port = authority.rpartition(":")
    if not sep:
        host, port = authority, str(default)
    if not host.strip("[]") or not PORT.fullmatch(port) or not valid_port(int(port)):
        raise ValueError(authority)
    return host, int(port)


async def _dial_or_reply(conn: Connection, host: str, port: int) -> Streams | None:
    try:
        return await conn.dial(host, port)
    except DialError as exc:
        print(f"refused {host}:{port}: {exc}", flush=True)
        _reply(conn.writer, exc.status, {"Proxy-Status": proxy_status(exc.error, exc.detail)})
        return None


def _split_target(target: str) -> tuple[str, int, str]:
    """`http://host[:port]/path?query` -> (host, port, origin-form path); a ValueError when not that.

    By hand: some clients send an IPv6 host without brackets (`http://::1/`), which urlsplit mangles."""
    scheme, sep, rest = target.partition("://")
    if scheme.lower() != "http" or not sep:
        raise ValueError(target)
    authority, _, path = rest.partition("/")
    host, port = _host_port(authority.rpartition("@")[2], 80)
    return host, port, "/" + path


async def _forward(conn: Connection, request: tuple[str, str, str], headers: list[tuple[str, str]]) -> None:
    method, target, version = request
    try:
        host, port, path = _split_target(target)
    except ValueError:
        _reply(conn.writer, 400)
        return
    upstream = await _dial_or_reply(conn, host, port)
    if upstream is None:
        return
    kept = [f"{name}: {value}" for name, value in headers if name.lower() not in DROPPED]
    head = "\r\n".join([f"{method} {path} {version}", *kept, "Connection: close"]) + "\r\n\r\n"
    upstream[1].write(head.encode("latin-1"))
    await conn.relay(upstream)


async def _head(conn: Connection) -> bytes | None:
    """The request head, or None once answered (too large, too late) or when the client left first."""
    try:
        async with asyncio.timeout(conn.config.limits.head_seconds):
            return await conn.reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        _reply(conn.writer, 431)
    except TimeoutError:
        _reply(conn.writer, 408)
    except asyncio.IncompleteReadError:
        pass
    return None


async def handle(conn: Connection) -> None:
    writer = conn.writer
    head = await _head(conn)
    if head is None:
        return
    request, *header_lines = head.decode("latin-1").split("\r\n")
    method, _, rest = request.partition(" ")
    target, _, version = rest.partition(" ")
    headers = [(n.strip(), v.strip()) for n, _, v in (line.partition(":") for line in header_lines if line)]
    if not version.startswith("HTTP/"):
        _reply(writer, 400)
        return
    if not await _authorized(headers, conn):
        _reply(writer, 407, {"Proxy-Authenticate": 'Basic realm="proxy"'})
        return
    if method.upper() != "CONNECT":
        await _forward(conn, (method, target, version), headers)
        return
    try:
        host, port = _host_port(target, 443)
    except ValueError:
        _reply(writer, 400)
        return
    upstream = await _dial_or_reply(conn, host, port)
    if upstream is not None:
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await conn.relay(upstream)
