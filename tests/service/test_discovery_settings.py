"""Discovery and health settings: environment prefixes, defaults and the errors that name the fix."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.settings import DiscoverySettings, HealthSettings


def test_environment_variables_use_the_documented_prefixes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROXY_OPERATOR_DISCOVERY_COOLDOWN_SECONDS", "3")
    monkeypatch.setenv("PROXY_OPERATOR_DISCOVERY_STORE", "redis")
    monkeypatch.setenv("PROXY_OPERATOR_DISCOVERY_REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("PROXY_OPERATOR_HEALTH_UNHEALTHY_THRESHOLD", "5")
    discovery, health = DiscoverySettings(), HealthSettings()
    assert (discovery.cooldown_seconds, discovery.store) == (3.0, "redis")
    assert (health.unhealthy_threshold, health.healthy_threshold, health.interval_seconds) == (5, 2, 10.0)


def test_defaults_are_the_documented_ones() -> None:
    discovery = DiscoverySettings()
    assert (discovery.penalty_base_seconds, discovery.penalty_cap_seconds) == (300.0, 3600.0)
    assert (discovery.max_wait_seconds, discovery.store) == (30.0, "memory")


def test_redis_without_a_url_names_the_variable() -> None:
    with pytest.raises(ValidationError, match="PROXY_OPERATOR_DISCOVERY_REDIS_URL"):
        DiscoverySettings(store="redis")


def test_a_default_lease_longer_than_the_maximum_is_refused() -> None:
    with pytest.raises(ValidationError, match="lease_ttl_max_seconds"):
        DiscoverySettings(lease_ttl_seconds=100, lease_ttl_max_seconds=50)


def test_wait_cannot_exceed_30_seconds() -> None:
    with pytest.raises(ValidationError, match="max_wait_seconds"):
        DiscoverySettings(max_wait_seconds=31)
