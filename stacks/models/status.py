"""What the service observed about a Proxy: phase, conditions, address, stack, last operation."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field

from stacks.models.wire import WireModel


class Condition(WireModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None
    observed_generation: int | None = None


class Address(WireModel):
    host: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)


class LastOperation(WireModel):
    model_config = ConfigDict(extra="ignore")

    type: str = Field(description="up, destroy, refresh or forget.")
    result: str = Field(description="succeeded, failed or in-progress.")
    started_at: datetime | None = None
    finished_at: datetime | None = None
    message: str = ""


class ProxyStatus(WireModel):
    model_config = ConfigDict(extra="ignore")

    phase: str | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    address: Address | None = None
    egress_ip: str | None = Field(default=None, alias="egressIP")
    observed_spec_hash: str | None = None
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation of the Proxy that this status describes."
    )
    stack: str | None = None
    last_operation: LastOperation | None = None
