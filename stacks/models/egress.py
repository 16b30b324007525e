"""`spec.egress`: where a proxy may connect to. The decision itself is `stacks.egress.decide`.

Safe by default: public addresses on ports 80 and 443 only; loopback, link-local and metadata, private,
CGNAT and unique-local ranges refused. A Proxy widens it explicitly, by port for public destinations
(`allowPorts`) or by destination range (`allow`), and nothing else: the decision is made on the address
actually connected to, so a host-name rule would be a DNS-rebinding hole (and nftables cannot hold one).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from stacks.models.wire import Cidr, WireModel, normalise_cidr

DEFAULT_ALLOW_PORTS = (80, 443)
Port = Annotated[int, Field(ge=1, le=65535)]


class EgressRule(WireModel):
    cidr: Cidr = Field(description="Destination range allowed, even inside a range the default refuses.")
    ports: list[Port] = Field(
        default_factory=list, max_length=32, description="Destination ports; empty means every port."
    )

    @field_validator("cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        return normalise_cidr(value)

    @field_validator("ports")
    @classmethod
    def _sorted_ports(cls, value: list[int]) -> list[int]:
        return sorted(set(value))


class EgressSpec(WireModel):
    allow_ports: list[Port] = Field(
        default_factory=lambda: list(DEFAULT_ALLOW_PORTS),
        max_length=64,
        description="Ports allowed to public addresses (default 80 and 443; add 25 only on purpose).",
    )
    allow: list[EgressRule] = Field(
        default_factory=list,
        max_length=64,
        description="Destinations allowed explicitly (test sites, the probe's echo); metadata stays refused.",
    )

    @field_validator("allow_ports")
    @classmethod
    def _sorted_ports(cls, value: list[int]) -> list[int]:
        return sorted(set(value))
