"""HTTP proxying: absolute-form requests forwarded over a fresh connection, CONNECT tunnels, Basic auth."""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress

from stacks.forward_proxy.config import ProxyConfig
from stacks.forward_proxy.dial import DialError, Streams, dial, relay
from stacks.forward_proxy.users import Gate

PROXY_NAME = "proxy-operator"
MAX_HEAD = 64 * 1024
REASONS = {400: "Bad Request", 403: "Forbidden", 407: "Proxy Authentication Required", 502: "Bad Gateway"}
REASONS |= {504: "Gateway Timeout", 431: "Request Header Fields Too Large"}
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


def _authorized(headers: list[tuple[str, str]], gate: Gate) -> bool:
    if gate.open:
        return True
    for name, value in headers:
        scheme, _, token = value.partition(" ")
        if name.lower() == "proxy-authorization" and scheme.lower() == "basic":
            try:
                given = base64.b64decode(token.strip(), validate=True)
            except (binascii.Error, ValueError):
                return False
            user, _, password = given.partition(b":")
            return gate.admits(user, password)
    return False


def _host_port(authority: str, default: int) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or a bare host; a bare IPv6 address (sent unbracketed by some clients) is
    read whole when it parses whole, else up to its last colon."""
    if authority.count(":") > 1 and not authority.startswith("["):
        try:
            return str(ipaddress.IPv6Address(authority)), default
        except ValueError:
            pass
    host, sep, port = authority.rpartition(":")
    if not sep:
        return authority, default
    return host, int(port)


async def _dial_or_reply(
    writer: asyncio.StreamWriter, host: str, port: int, config: ProxyConfig
) -> Streams | None:
    try:
        return await dial(host, port, config.egress)
    except DialError as exc:
        print(f"refused {host}:{port}: {exc}", flush=True)
        _reply(writer, exc.status, {"Proxy-Status": proxy_status(exc.error, exc.detail)})
        return None


def _split_target(target: str) -> tuple[str, int, str]:
    """`http://host[:port]/path?query` -> (host, port, origin-form path); a ValueError when not that.

    By hand: some clients send an IPv6 host without brackets (`http://::1/`), which urlsplit mangles."""
    scheme, sep, rest = target.partition("://")
    if scheme.lower() != "http" or not sep:
        raise ValueError(target)
    authority, _, path = rest.partition("/")
    host, port = _host_port(authority.rpartition("@")[2], 80)
    if not host:
        raise ValueError(target)
    return host, port, "/" + path


async def _forward(
    client: Streams, request: tuple[str, str, str], headers: list[tuple[str, str]], config: ProxyConfig
) -> None:
    method, target, version = request
    try:
        host, port, path = _split_target(target)
    except ValueError:
        _reply(client[1], 400)
        return
    upstream = await _dial_or_reply(client[1], host, port, config)
    if upstream is None:
        return
    kept = [f"{name}: {value}" for name, value in headers if name.lower() not in DROPPED]
    head = "\r\n".join([f"{method} {path} {version}", *kept, "Connection: close"]) + "\r\n\r\n"
    upstream[1].write(head.encode("latin-1"))
    await relay(client, upstream)


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gate: Gate) -> None:
    config = gate.config
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        _reply(writer, 431)
        return
    except asyncio.IncompleteReadError:
        return
    request, *header_lines = head.decode("latin-1").split("\r\n")
    method, _, rest = request.partition(" ")
    target, _, version = rest.partition(" ")
    headers = [(n.strip(), v.strip()) for n, _, v in (line.partition(":") for line in header_lines if line)]
    if not version.startswith("HTTP/"):
        _reply(writer, 400)
        return
    if not _authorized(headers, gate):
        _reply(writer, 407, {"Proxy-Authenticate": 'Basic realm="proxy"'})
        return
    if method.upper() != "CONNECT":
        await _forward((reader, writer), (method, target, version), headers, config)
        return
    try:
        host, port = _host_port(target, 443)
    except ValueError:
        _reply(writer, 400)
        return
    upstream = await _dial_or_reply(writer, host, port, config)
    if upstream is not None:
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await relay((reader, writer), upstream)
