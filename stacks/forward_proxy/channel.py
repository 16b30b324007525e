"""What names a control channel (control.py), and the token a `tcp://` channel's requests carry.

A channel is a unix socket path (the `local` provider's proxies), `shared:NAMESPACE/NAME@PATH` (one proxy of a
shared listener, `shared_listener.py`: the unix socket PATH, every request naming the proxy), or
`tcp://HOST:PORT` (a proxy pod's, which the service reaches from its own pods). Over TCP every request carries
`control_token(password)`: HMAC-SHA256 keyed with the proxy's own password over a fixed message, hex. The
service holds every proxy's own credentials (the stack outputs) and derives it without another secret to
publish; a lease user, who is never given the proxy's password on a proxy with a channel, cannot.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlsplit

TCP_SCHEME = "tcp://"
SHARED_SCHEME = "shared:"
TOKEN_MESSAGE = b"proxy-operator control"


def control_token(password: str) -> str:
    return hmac.new(password.encode(), TOKEN_MESSAGE, hashlib.sha256).hexdigest()


def token_matches(given: object, password: str) -> bool:
    """Is `given` the channel's token? In constant time; anything but an ASCII string is not."""
    return isinstance(given, str) and given.isascii() and hmac.compare_digest(given, control_token(password))


def tcp_address(channel: str) -> tuple[str, int] | None:
    """(host, port) of a `tcp://HOST:PORT` channel; None for a unix socket path; ValueError for a `tcp://`
    channel that is not just a host and a port."""
    if not channel.startswith(TCP_SCHEME):
        return None
    try:
        parts = urlsplit(channel)
        host, port = parts.hostname, parts.port
    except ValueError as exc:  # a port out of range or not a number
        raise ValueError(f"control {channel!r}: tcp://HOST:PORT ({exc})") from exc
    if not host or port is None or parts.path or parts.query or parts.fragment or parts.username:
        raise ValueError(f"control {channel!r}: tcp://HOST:PORT")
    return host, port


def tcp_channel(host: str, port: int) -> str:
    """`tcp://HOST:PORT`, an IPv6 address in brackets."""
    return f"{TCP_SCHEME}[{host}]:{port}" if ":" in host else f"{TCP_SCHEME}{host}:{port}"


def shared_channel(path: str, proxy: str) -> str:
    """The channel of the proxy `proxy` (`namespace/name`) served by the shared listener at `path`."""
    return f"{SHARED_SCHEME}{proxy}@{path}"


def shared_address(channel: str) -> tuple[str, str] | None:
    """(socket path, proxy) of a `shared:` channel; None for any other channel. A proxy key is two DNS
    labels, so the first `@` ends it (a path may hold more)."""
    if not channel.startswith(SHARED_SCHEME):
        return None
    proxy, at, path = channel[len(SHARED_SCHEME) :].partition("@")
    if not at or not proxy or not path:
        raise ValueError(f"control {channel!r}: {SHARED_SCHEME}NAMESPACE/NAME@PATH")
    return path, proxy
