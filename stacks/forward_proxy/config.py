"""The forward proxy's configuration file: one JSON object, written 0600 by the `local` provider.

{"bind": "127.0.0.1", "port": 3128, "protocol": "http"|"socks5", "username": ..., "password": ...,
 "egress": {spec.egress by alias},
 "sources": [allowedSourceRanges], "control": "/state/dir/STEM.ctl" | null}; no username means no
authentication. `control` is where the proxy listens for lease users (control.py); null: no lease users.
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stacks.egress import canonical
from stacks.models import EgressSpec


@dataclass(frozen=True)
class ProxyConfig:
    bind: str
    port: int
    protocol: str
    egress: EgressSpec
    sources: tuple[str, ...] = ()  # CIDRs that may connect; empty: anyone who reaches the bind address
    username: str | None = None
    password: str | None = None
    control: str | None = None  # the control socket's path

    @classmethod
    def read(cls, path: Path) -> ProxyConfig:
        raw = json.loads(path.read_text())
        return cls(
            bind=raw["bind"],
            port=int(raw["port"]),
            protocol=raw["protocol"],
            egress=EgressSpec.model_validate(raw.get("egress") or {}),
            sources=tuple(raw.get("sources") or ()),
            username=raw.get("username") or None,
            password=raw.get("password") or None,
            control=raw.get("control") or None,
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
        }

    def write(self, path: Path) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(self.to_json(), handle)
