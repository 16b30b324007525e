"""How wide the sources of a proxy without credentials may be: its own module, free of pydantic, so the
engine's configuration (automation/engine/config.py) reads it without loading the models."""

from __future__ import annotations

import os

# Without credentials a proxy's sources may cover at most this many addresses (one /16, one /48): wider is an
# open proxy in all but name (0.0.0.0/1 + 128.0.0.0/1 is the internet). The CRD holds the per-range prefix.
NO_AUTH_MAX_PREFIX_ENV = "PROXY_OPERATOR_NO_AUTH_MIN_PREFIX"  # "16,48": the IPv4 and IPv6 prefix lengths
DEFAULT_NO_AUTH_MIN_PREFIX = (16, 48)
NO_AUTH_MAX_ITEMS = 32


def no_auth_min_prefix() -> tuple[int, int]:
    """(IPv4, IPv6) prefix lengths whose size bounds the sources of a proxy without credentials."""
    raw = os.environ.get(NO_AUTH_MAX_PREFIX_ENV, "")
    try:
        v4, v6 = (int(part) for part in raw.split(","))
    except ValueError:
        return DEFAULT_NO_AUTH_MIN_PREFIX
    return v4, v6
