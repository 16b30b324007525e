"""Request and response bodies of the discovery API (camelCase on the wire, unknown fields refused)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
TARGET_PATTERN = rf"^(\*|{_LABEL}(\.{_LABEL})*\.?)$"
_DOMAIN = re.compile(TARGET_PATTERN)
TARGET_HELP = "a domain such as example.com (no scheme, port or path), or * for any"
Name = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")]
LabelKey = Annotated[str, Field(min_length=1, max_length=317, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")]
MAX_LABELS = 32  # as many as a selector needs; every list and map of a request body is bounded
LabelValue = Annotated[str, Field(max_length=63, pattern=r"^[A-Za-z0-9._-]*$")]


def normalise_target(value: str | None) -> str | None:
    if value is None:
        return None
    if not _DOMAIN.match(value):
        raise ValueError(f"target must be {TARGET_HELP}; got {value!r}")
    return value.lower().rstrip(".")


class _In(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class _Out(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True)


class LeaseBody(_In):
    count: int = Field(1, ge=1, description="How many distinct proxies, at most (lowered to max_count).")
    pool: Name | None = Field(None, description="Only proxies of this pool.")
    provider: Name | None = Field(None, description="Only proxies of this provider instance.")
    protocol: Literal["http", "socks5"] | None = Field(None, description="Only proxies of this protocol.")
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=MAX_LABELS,
        description=f"Only proxies with all these (at most {MAX_LABELS}).",
    )
    target: str | None = Field(
        None,
        max_length=253,
        pattern=TARGET_PATTERN,
        description=f"The site the proxies are for: {TARGET_HELP}.",
    )
    session: str | None = Field(
        None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$", description="Sticky session name."
    )
    strict: bool = Field(False, description="With a session: fail (409) instead of re-binding.")
    ttl: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Lease lifetime in seconds (lowered to lease_ttl_max_seconds).",
    )
    wait: float = Field(
        0,
        ge=0,
        allow_inf_nan=False,
        description="Seconds to wait for a proxy instead of an immediate 503 (lowered to max_wait_seconds).",
    )

    @field_validator("target")
    @classmethod
    def _target(cls, value: str | None) -> str | None:
        return normalise_target(value)

    @model_validator(mode="after")
    def _session_binds_one(self) -> LeaseBody:
        if self.session is not None and self.count != 1:
            raise ValueError("a session binds one proxy: send count 1 (or leave it out) with a session")
        if self.strict and self.session is None:
            raise ValueError("strict applies to sessions: send a session with strict, or drop strict")
        return self


class LeasedProxy(_Out):
    lease_id: str
    expires_at: datetime
    key: str
    url: str = Field(description="Ready for a client's proxy setting; credentials included.")
    host: str
    port: int
    protocol: Literal["http", "socks5"]
    username: str | None
    password: str | None
    credentials_scope: Literal["lease", "proxy"] = Field(
        description="`lease`: the credentials are this lease's own, refused once it is released or expired; "
        "`proxy`: the proxy's own, shared by every lease on it and valid beyond this one (docs/api.md)."
    )
    pool: str | None
    provider: str
    egress_ip: str | None


LOWERED_HELP = "Request values above the server's limits, each with the value used instead (none: {})."


class LeaseResponse(_Out):
    leases: list[LeasedProxy]
    target: str
    session: str | None = None
    rebound: bool = Field(False, description="True when the session's previous proxy was replaced.")
    previous_proxy: str | None = None
    lowered: dict[str, int | float] = Field(default_factory=dict, description=LOWERED_HELP)


class RenewBody(_In):
    ttl: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Seconds from now the lease ends (default lease_ttl_seconds, lowered to the maximum).",
    )


class RenewResponse(_Out):
    lease_id: str
    key: str
    target: str
    expires_at: datetime
    lowered: dict[str, int | float] = Field(default_factory=dict, description=LOWERED_HELP)


class ReportBody(_In):
    lease: str | None = Field(
        None, min_length=1, max_length=128, description="The lease id (required for `banned` and `ok`)."
    )
    proxy: str | None = Field(
        None, min_length=3, max_length=507, description="Or, for `error` only, the proxy key namespace/name."
    )
    target: str | None = Field(
        None,
        max_length=253,
        pattern=TARGET_PATTERN,
        description=f"The lease's target, which it is by default; another is refused (409): {TARGET_HELP}.",
    )
    outcome: Literal["ok", "banned", "error"]
    status_code: int | None = Field(None, ge=100, le=599, description="The HTTP status the target answered.")

    @field_validator("target")
    @classmethod
    def _target(cls, value: str | None) -> str | None:
        return normalise_target(value)

    @model_validator(mode="after")
    def _one_subject(self) -> ReportBody:
        if (self.lease is None) == (self.proxy is None):
            raise ValueError("send exactly one of lease (a lease id) or proxy (namespace/name)")
        return self


EFFECT_HELP = (
    "What the report did: `penalised` (banned), `strikes_reset` (ok, no penalty running), `penalty_runs` "
    "(ok, but a running penalty is never lifted by a report), `counted` (error, counted against health), "
    "`awaiting_quorum` (error, too few clients agree yet), `already_counted` (error: this client's vote "
    "counts once per window; banned: a lease's ban counts once)."
)


class ReportResponse(_Out):
    proxy: str
    target: str
    outcome: str
    penalised_until: datetime | None = None
    strikes: int | None = Field(
        None, description="Bans in a row for this proxy and target, this one included: 1 for the first."
    )
    effect: str = Field(description=EFFECT_HELP)


class HealthOut(_Out):
    state: Literal["unknown", "healthy", "unhealthy"]
    egress_ip: str | None
    consecutive_failures: int
    consecutive_successes: int
    last_probe_at: datetime | None
    last_latency_seconds: float | None
    last_error: str | None


class PenaltyOut(_Out):
    target: str
    until: datetime
    strikes: int = Field(description="Bans in a row for this target since the last good report (1, 2, ...).")


class ProxyOut(_Out):
    key: str
    namespace: str
    name: str
    provider: str
    pool: str | None
    labels: dict[str, str]
    protocol: str
    host: str | None
    port: int | None
    stack: str | None
    health: HealthOut
    shared_egress_with: list[str] = Field(description="Other proxies leaving through the same egress IP.")


class ProxyDetail(ProxyOut):
    penalties: list[PenaltyOut] = Field(description="Targets this proxy is banned for, and until when.")


class SharedEgress(_Out):
    ip: str
    proxies: list[str]


class ProxyList(_Out):
    items: list[ProxyOut]
    count: int
    shared_egress: list[SharedEgress]


class Status(_Out):
    status: str


class Echo(_Out):
    ip: str = Field(description="The address this request came from (through a proxy: its egress IP).")
    port: int | None


class Limits(_Out):
    max_count: int = Field(description="Most proxies one lease request gets; a larger count is lowered.")
    lease_ttl_seconds: float = Field(description="A lease's lifetime when the request gives no ttl.")
    lease_ttl_max_seconds: float = Field(description="Longest lease (and renewal); a larger ttl is lowered.")
    max_wait_seconds: float = Field(description="Longest wait of a lease request; a larger wait is lowered.")
    cooldown_seconds: float = Field(description="No same proxy for the same client and target before this.")
    session_idle_seconds: float = Field(description="A sticky session unused this long is forgotten.")


class Whoami(_Out):
    name: str = Field(description="The client name: cooldowns, sessions and leases are kept per name.")
    scopes: list[str] = Field(description="What the token allows: lease, report, admin.")
    limits: Limits = Field(description="The limits this server applies to lease requests.")
