"""The ProxyPool object (crawl.example.com/v1alpha1): a template, a placement and a count of Proxies.

The service expands a pool into ordinary child Proxies (`service/pools/`), so everything below a pool is
still plain Proxies, stacks and hashes. Durations are written `90s`, `30m`, `12h` or `7d`.
"""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal

from pydantic import ConfigDict, Field, model_validator

from stacks.models.proxy import ObjectMeta, ProxySpec
from stacks.models.status import Condition
from stacks.models.wire import API_VERSION, Dns1123Label, WireModel

POOL_KIND: Final = "ProxyPool"
DURATION_PATTERN = r"^[0-9]{1,7}(s|m|h|d)$"
PERCENT_OR_COUNT = r"^([0-9]{1,5}|[0-9]{1,2}%|100%)$"
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

Duration = Annotated[str, Field(pattern=DURATION_PATTERN, max_length=8)]


def seconds(duration: str) -> float:
    """`30m` -> 1800.0."""
    match = re.fullmatch(DURATION_PATTERN, duration)
    if match is None:
        raise ValueError(f"'{duration}' is not a duration: write it like 90s, 30m, 12h or 7d")
    return float(int(duration[:-1]) * _UNIT_SECONDS[duration[-1]])


class PoolProxySpec(ProxySpec):
    """A Proxy spec whose provider comes from the placement (a provider set here is refused)."""

    provider: Dns1123Label | None = Field(  # type: ignore[assignment]
        default=None, description="Not set in a template: each placement names its provider."
    )

    @model_validator(mode="after")
    def _no_provider(self) -> PoolProxySpec:
        if self.provider is not None:
            raise ValueError("a pool template names no provider: list providers under spec.placement")
        return self


class PoolTemplateMeta(WireModel):
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class PoolTemplate(WireModel):
    metadata: PoolTemplateMeta = Field(default_factory=PoolTemplateMeta)
    spec: PoolProxySpec = Field(default_factory=lambda: PoolProxySpec.model_validate({}))


class PoolPlacement(WireModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "!(has(self.weight) && has(self.count))", "message": "set weight or count, not both"}
            ]
        }
    )

    provider: Dns1123Label = Field(description="A catalogue entry.")
    weight: int | None = Field(default=None, ge=0, le=1000, description="Share of the replicas; default 1.")
    count: int | None = Field(default=None, ge=0, le=10000, description="A fixed number of children here.")
    zone: Dns1123Label | None = Field(default=None, description="gcp: the children's zone.")
    port_base: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="local: children share one host, so each takes the first free port from this one.",
    )

    @model_validator(mode="after")
    def _weight_or_count(self) -> PoolPlacement:
        if self.weight is not None and self.count is not None:
            raise ValueError(f"placement {self.provider}: set weight or count, not both")
        return self

    @property
    def key(self) -> str:
        """Which placement a child belongs to (its label `crawl.example.com/pool-placement`)."""
        return self.provider if self.zone is None else f"{self.provider}.{self.zone}"


class BanRule(WireModel):
    count: int = Field(ge=1, le=1000, description="Ban reports from this many distinct clients...")
    window: Duration = Field(default="1h", description="...within this window, across targets.")


class PoolRotation(WireModel):
    max_age: Duration | None = Field(default=None, description="Replace a child older than this.")
    replace_after_bans: BanRule | None = None
    unhealthy_after: Duration | None = Field(default=None, description="Replace a child unhealthy this long.")
    max_unavailable: Annotated[str, Field(pattern=PERCENT_OR_COUNT)] = Field(
        default="1", description="Replacements at once: a count or a percent of the replicas (at least 1)."
    )
    drain_timeout: Duration = Field(default="5m", description="Longest wait for a drained child's leases.")
    ready_timeout: Duration = Field(default="5m", description="A replacement not healthy by then rolls back.")
    backoff: Duration = Field(default="1m", description="Wait after a rollback; doubles per failure, to 1h.")


class DemandScaling(WireModel):
    window: Duration = Field(default="1m", description="Unmet lease requests are counted over this window.")
    unmet_requests: int = Field(default=5, ge=1, description="This many 503s in the window add one child.")
    idle_window: Duration = Field(default="10m", description="Children not leased for this long are idle.")
    idle_share: float = Field(default=0.5, ge=0.01, le=1, description="This share idle removes one child.")


class ProxyPoolSpec(WireModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.minReplicas) || !has(self.maxReplicas) || "
                    "self.minReplicas <= self.maxReplicas",
                    "message": "minReplicas must not exceed maxReplicas",
                },
            ]
        }
    )

    template: PoolTemplate = Field(default_factory=PoolTemplate)
    placement: list[PoolPlacement] = Field(min_length=1, max_length=32)
    replicas: int = Field(ge=0, le=10000)
    min_replicas: int | None = Field(default=None, ge=0, le=10000)
    max_replicas: int | None = Field(default=None, ge=0, le=10000)
    rotation: PoolRotation = Field(default_factory=PoolRotation, json_schema_extra={"default": {}})
    demand: DemandScaling | None = Field(default=None, description="Scale within min/max by lease demand.")

    @model_validator(mode="after")
    def _bounds(self) -> ProxyPoolSpec:
        low, high = self.min_replicas, self.max_replicas
        if low is not None and high is not None and low > high:
            raise ValueError(f"minReplicas {low} exceeds maxReplicas {high}")
        keys = [p.key for p in self.placement]
        if len(set(keys)) != len(keys):
            raise ValueError("two placements name the same provider and zone: merge them")
        return self

    def clamp(self, replicas: int) -> int:
        """`replicas` within minReplicas..maxReplicas."""
        if self.min_replicas is not None:
            replicas = max(replicas, self.min_replicas)
        if self.max_replicas is not None:
            replicas = min(replicas, self.max_replicas)
        return replicas

    def max_unavailable_count(self) -> int:
        text = self.rotation.max_unavailable
        if text.endswith("%"):
            return max(1, self.replicas * int(text[:-1]) // 100)
        return max(1, int(text))


class ProxyPoolStatus(WireModel):
    """What the service observed; written by proxy-operator only."""

    model_config = ConfigDict(extra="ignore")

    desired: int = 0
    ready: int = 0
    placements: dict[str, int] = Field(default_factory=dict, description="Children per placement.")
    replacing: int = Field(default=0, description="Replacements in progress.")
    conditions: list[Condition] = Field(default_factory=list)


class ProxyPool(WireModel):
    api_version: Literal["crawl.example.com/v1alpha1"] = API_VERSION
    kind: Literal["ProxyPool"] = POOL_KIND
    metadata: ObjectMeta
    spec: ProxyPoolSpec
    status: ProxyPoolStatus = Field(default_factory=ProxyPoolStatus)

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"
