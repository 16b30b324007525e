"""Settings of the discovery API and the health engine (the lead composes them into the top-level settings).

Every field has a safe default and is documented in docs/api.md. Environment variables:
`PROXY_OPERATOR_DISCOVERY_<FIELD>` and `PROXY_OPERATOR_HEALTH_<FIELD>`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class DiscoverySettings(BaseSettings):
    """Selection, cooldown, penalty, session and lease behaviour of `/v1/leases`."""

    model_config = SettingsConfigDict(env_prefix="PROXY_OPERATOR_DISCOVERY_", extra="forbid")

    store: Literal["memory", "redis"] = Field(
        "memory", description="Where cooldowns, penalties, sessions and leases live; `redis` for replicas."
    )
    redis_url: str | None = Field(None, description="redis://host:port/db; required when store=redis.")
    redis_prefix: str = Field("proxy-operator", description="Prefix of every Redis key this service writes.")
    tokens_file: Path | None = Field(
        None, description="YAML/JSON list of {name, scopes, sha256} (a mounted Secret); re-read on change."
    )
    cooldown_seconds: float = Field(
        10.0,
        ge=0,
        le=86400,
        description="A proxy handed to a client for a target is not handed to that "
        "client for that target again for this long (and not while the lease is held).",
    )
    lease_ttl_seconds: float = Field(60.0, gt=0, le=86400, description="Default lease lifetime.")
    lease_ttl_max_seconds: float = Field(3600.0, gt=0, le=86400, description="Longest lease allowed.")
    session_idle_seconds: float = Field(
        1800.0, gt=0, le=7 * 86400, description="A sticky session is forgotten after this long unused."
    )
    penalty_base_seconds: float = Field(300.0, gt=0, description="Ban backoff base (see cap).")
    penalty_cap_seconds: float = Field(
        3600.0, gt=0, description="Ban n+1 penalises uniform(0, min(cap, base*2**n))."
    )
    max_wait_seconds: float = Field(30.0, ge=0, le=30, description="Longest `wait` a lease request may ask.")
    max_count: int = Field(100, ge=1, le=1000, description="Most proxies one lease request may ask for.")
    report_window_seconds: float = Field(
        600.0,
        ge=0,
        le=3600,
        description="A client may report on a proxy while it holds a lease on it and this long after the "
        "lease ended; otherwise 403 not_a_leaseholder.",
    )
    ended_leases_kept: int = Field(
        20_000,
        ge=0,
        le=10_000_000,
        description="The memory store keeps this many ended leases (the latest ended) for reports by lease "
        "id, each for at most an hour; a report on one it forgot gets 404 lease_not_found, and a report by "
        "proxy and target still counts within report_window_seconds. About 300 bytes each.",
    )
    error_quorum: int = Field(
        2,
        ge=1,
        le=100,
        description="Distinct clients whose `error` reports on a proxy must agree (within "
        "error_window_seconds) before they count against its health; the prober counts on its own.",
    )
    error_window_seconds: float = Field(
        120.0, gt=0, le=3600, description="How long a client's `error` report on a proxy stays a vote."
    )
    report_rate_limit: int = Field(
        6000,
        ge=1,
        le=1_000_000,
        description="Most reports one client (token name) may send per report_rate_period_seconds; more: "
        "429 with Retry-After.",
    )
    report_rate_period_seconds: float = Field(
        60.0, gt=0, le=3600, description="The fixed window report_rate_limit counts in."
    )
    max_body_bytes: int = Field(
        65536,
        ge=1024,
        le=16 * 1024 * 1024,
        description="Largest request body, counted as it streams in (larger: 413); only a known token may "
        "send a body at all (else 401, before any of it is read).",
    )

    lease_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="A client holds leases on at most this share of the proxies its request matches (at "
        "least one; a proxy it holds for another target counts once); past it 429 lease_share. A token's "
        "own `leaseShare` overrides it.",
    )
    lease_rate: float = Field(
        50.0,
        gt=0,
        le=100_000,
        description="Leases one client may take per second, every pool counted (a token bucket of "
        "lease_burst); past it 429 lease_rate. A token's own `leaseRate` overrides it.",
    )
    lease_burst: int = Field(
        200, ge=1, le=100_000, description="How many leases above lease_rate one client may take at once."
    )

    lease_scoped_credentials: bool = Field(
        True,
        description="A lease on a proxy that can add users at run time (local) gets a user of its own, "
        "revoked at release and ended by the proxy at expiry; false: leases get the proxy's credentials.",
    )

    @property
    def report_keep_seconds(self) -> float:
        """How long the memory store keeps who held which proxy and the `error` votes: the longest window a
        report looks back."""
        return max(self.report_window_seconds, self.error_window_seconds)

    @model_validator(mode="after")
    def _redis_needs_url(self) -> DiscoverySettings:
        if self.store == "redis" and not self.redis_url:
            raise ValueError(
                "store=redis needs redis_url (PROXY_OPERATOR_DISCOVERY_REDIS_URL=redis://host:6379/0)"
            )
        if self.lease_ttl_seconds > self.lease_ttl_max_seconds:
            raise ValueError("lease_ttl_seconds must not exceed lease_ttl_max_seconds")
        return self


class HealthSettings(BaseSettings):
    """How often and how the health engine probes each proxy."""

    model_config = SettingsConfigDict(env_prefix="PROXY_OPERATOR_HEALTH_", extra="forbid")

    interval_seconds: float = Field(10.0, gt=0, le=3600, description="Time between two probes of one proxy.")
    jitter: float = Field(0.1, ge=0, le=0.5, description="Each interval is spread by +/- this fraction.")
    concurrency: int = Field(200, ge=1, le=10000, description="Most probes in flight at once.")
    connect_timeout_seconds: float = Field(3.0, gt=0, le=60, description="TCP connect to the proxy port.")
    probe_timeout_seconds: float = Field(5.0, gt=0, le=120, description="Whole probe, connect included.")
    unhealthy_threshold: int = Field(3, ge=1, le=100, description="Consecutive failures before unhealthy.")
    healthy_threshold: int = Field(2, ge=1, le=100, description="Consecutive successes before healthy again.")
    probe_url: str | None = Field(
        None, description="URL fetched through each proxy (http, or https via CONNECT); default: /v1/echo."
    )
