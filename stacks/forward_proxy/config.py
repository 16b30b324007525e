"""The forward proxy's configuration file: one JSON object, written 0600 by the `local` provider.

{"bind": "127.0.0.1", "port": 3128, "protocol": "http"|"socks5", "username": ..., "password": ...,
 "egress": {spec.egress by alias},
 "sources": [allowedSourceRanges], "control": "/state/dir/STEM.ctl" | "tcp://HOST:PORT" | null,
 "limits": {"head_seconds": 10, "handshake_seconds": 10, "idle_seconds": 300, "per_source": 256,
            "total": 1024, "lease_hold_seconds": 15}}; no username means no authentication. `control` is
where the proxy listens for lease users (control.py; over tcp only with a password, which keys its token);
null: no lease users.
`limits` and each of its keys are optional (`Limits` says what each bounds); a file written before they
existed keeps working with the defaults.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from stacks.egress import canonical
from stacks.forward_proxy.channel import tcp_address
from stacks.models import EgressSpec


@dataclass(frozen=True)
class Limits:
    """What one client may hold of the proxy before authenticating, while idle, and at once: without them
    anyone inside the allowed sources could hold its file descriptors with connections that say nothing."""

    head_seconds: float = 10.0  # from accept to the end of an HTTP request head (408 past it)
    handshake_seconds: float = 10.0  # from accept to the end of a SOCKS5 request (greeting, login, request)
    idle_seconds: float = 300.0  # a relay with no byte read either way for this long is closed on both sides
    per_source: int = 256  # connections open at once from one address (IPv6: one /64); past it 429
    total: int = 1024  # connections open at once in all (lowered to what the descriptor limit allows); 503
    # On a tcp control channel (a proxy pod's, whose live lease users the service adds to each new instance,
    # service/discovery/lease_users.py `follow`): for this long after the channel opens, a login of a lease
    # user this instance has never seen waits for the user to arrive instead of a 407 at once; 0: no wait.
    lease_hold_seconds: float = 15.0

    def __post_init__(self) -> None:
        for name in ("head_seconds", "handshake_seconds", "idle_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"limits.{name}: a number of seconds, not {value!r}")
            if value <= 0:
                raise ValueError(f"limits.{name}: more than 0 seconds, not {value!r}")
        hold = self.lease_hold_seconds
        if isinstance(hold, bool) or not isinstance(hold, int | float) or not 0 <= hold <= 300:
            raise ValueError(f"limits.lease_hold_seconds: 0 to 300 seconds, not {hold!r}")
        for name in ("per_source", "total"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"limits.{name}: a whole number of connections, at least 1, not {value!r}")

    def to_json(self) -> dict[str, Any]:
        """Every limit, but the lease hold only when it is not the default: the file a pod's Secret holds
        stays what it was before the hold existed, so an upgrade rolls no pod for it."""
        written = asdict(self)
        if self.lease_hold_seconds == Limits.lease_hold_seconds:
            del written["lease_hold_seconds"]
        return written

    @classmethod
    def from_json(cls, raw: object) -> Limits:
        if not isinstance(raw, dict):
            raise ValueError(f"limits: an object, not {raw!r}")
        known = {f.name for f in fields(cls)}
        if unknown := set(raw) - known:
            raise ValueError(f"limits: unknown keys {sorted(unknown)}")
        return cls(**raw)


@dataclass(frozen=True)
class ProxyConfig:
    bind: str
    port: int
    protocol: str
    egress: EgressSpec
    sources: tuple[str, ...] = ()  # CIDRs that may connect; empty: anyone who reaches the bind address
    username: str | None = None
    password: str | None = None
    control: str | None = None  # the control socket's path, or tcp://HOST:PORT (control.py)
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if self.control is not None and tcp_address(self.control) is not None and not self.password:
            raise ValueError(
                f"control {self.control}: a tcp control channel needs the proxy's password (its requests "
                "carry a token derived from it); set password, or use a unix socket path"
            )

    @classmethod
    def read(cls, path: Path) -> ProxyConfig:
        return cls.parse(path.read_bytes())

    @classmethod
    def parse(cls, data: bytes) -> ProxyConfig:
        raw = json.loads(data)
        return cls(
            bind=raw["bind"],
            port=int(raw["port"]),
            protocol=raw["protocol"],
            egress=EgressSpec.model_validate(raw.get("egress") or {}),
            sources=tuple(raw.get("sources") or ()),
            username=raw.get("username") or None,
            password=raw.get("password") or None,
            control=raw.get("control") or None,
            limits=Limits.from_json(raw.get("limits") or {}),
        )

    def admits(self, peer: str) -> bool:
        """Is a client at `peer` among the allowed sources (always, without ranges)?"""
        if not self.sources:
            return True
        address = canonical(peer)
        return any(address in ipaddress.ip_network(cidr) for cidr in self.sources)

    def to_json(self) -> dict[str, Any]:
        return {
            "bind": self.bind,
            "port": self.port,
            "protocol": self.protocol,
            "egress": self.egress.model_dump(by_alias=True, mode="json"),
            "sources": list(self.sources),
            "username": self.username,
            "password": self.password,
            "control": self.control,
            "limits": self.limits.to_json(),
        }

    def write(self, path: Path) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(self.to_json(), handle)
